"""Other processes' CPU time: counted when it is theirs, not when it is ours."""

from __future__ import annotations

import subprocess
import sys

from tasks.measure.hostload import OtherCpu, busy_cpu_seconds, own_cpu_seconds

# Burns ``seconds`` of its own CPU time (not wall time: the host may be busy), then exits.
BURN = "import time\nwhile time.process_time() < {s}: pass\n"


def test_a_child_process_is_our_own_cpu():
    before = own_cpu_seconds()
    subprocess.run([sys.executable, "-c", BURN.format(s=0.6)], check=True)
    assert own_cpu_seconds() - before >= 0.5


# A child that starts a CPU-burning grandchild, reaps it, and stays alive until its stdin closes
# (Inductor's compile worker running g++): the grandchild's time is in the live child's
# children_user|system only.
REAPER = (
    "import subprocess, sys\n"
    "subprocess.run([sys.executable, '-c', sys.argv[1]], check=True)\n"
    "print('reaped', flush=True)\n"
    "sys.stdin.read()\n"
)


def test_cpu_of_a_grandchild_reaped_by_a_live_child_is_our_own():
    before = own_cpu_seconds()
    child = subprocess.Popen(
        [sys.executable, "-c", REAPER, BURN.format(s=0.6)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "reaped"
        during = own_cpu_seconds() - before  # the child is alive, the burner reaped by it
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
    assert during >= 0.55  # the grandchild's 0.6 s (plus two interpreters' start-up)


def test_a_process_that_is_not_ours_is_other_cpu(tmp_path):
    done = tmp_path / "done"
    busy0, own0 = busy_cpu_seconds(), own_cpu_seconds()
    # sh starts the burner in the background and exits: the burner is no descendant of ours
    code = BURN.format(s=0.6) + f"open({str(done)!r}, 'w').close()\n"
    subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0" >/dev/null 2>&1 &', code], check=True)
    while not done.exists():
        pass  # this loop is our own CPU: it must not be counted as other work
    other = (busy_cpu_seconds() - busy0) - (own_cpu_seconds() - own0)
    assert other >= 0.45


def _scripted(monkeypatch, wall: list[float], busy: list[float], own: list[float], cores: int) -> None:
    """Scripted OS counters: each call returns the next reading."""
    from tasks.measure import hostload

    for name, values in (("wall_clock", wall), ("busy_cpu_seconds", busy), ("own_cpu_seconds", own)):
        it = iter(values)
        monkeypatch.setattr(hostload, name, lambda it=it: next(it))
    monkeypatch.setattr(hostload.os, "cpu_count", lambda: cores)


def test_the_fraction_is_other_cpu_over_all_cores_wall_time(monkeypatch):
    # Before: asserted a clamped value lies in [0, 1], which any formula passes.
    # 10 s on 2 cores = 20 core-seconds; the host was busy 13 of them, 8 ours: 5 / 20 = 0.25
    _scripted(monkeypatch, wall=[100.0, 110.0], busy=[50.0, 63.0], own=[7.0, 15.0], cores=2)
    assert OtherCpu().start().stop() == 0.25
    # our own CPU never counts as other work, even when it is all the host did
    _scripted(monkeypatch, wall=[0.0, 4.0], busy=[0.0, 8.0], own=[0.0, 8.0], cores=2)
    assert OtherCpu().start().stop() == 0.0
    # tick rounding can make "other" overshoot the wall: capped at every core busy
    _scripted(monkeypatch, wall=[0.0, 1.0], busy=[0.0, 2.5], own=[0.0, 0.0], cores=2)
    assert OtherCpu().start().stop() == 1.0
