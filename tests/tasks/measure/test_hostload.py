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
