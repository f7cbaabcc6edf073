"""Other processes' CPU time: counted when it is theirs, not when it is ours."""

from __future__ import annotations

import subprocess
import sys

from tasks.measure.hostload import OtherCpu, busy_cpu_seconds, other_cpu_fraction_before, own_cpu_seconds

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


def test_fractions_are_shares_of_all_cores():
    assert 0.0 <= other_cpu_fraction_before(0.05) <= 1.0 + 1e-6
    share = OtherCpu().start()
    assert 0.0 <= share.stop() <= 1.0 + 1e-6
