"""Host peak memory counts loader worker (child) processes too."""

from __future__ import annotations

import subprocess
import sys

from tasks.memory import PeakMemory

MIB = 2**20
# Holds 300 MiB of touched memory until the parent closes its stdin.
HOLD = "import sys\nb = bytearray(300 * 2**20)\nprint('ready', flush=True)\nsys.stdin.read()\n"


def test_children_count_in_host_peak_bytes():
    mem = PeakMemory(interval=0.01).start()
    own = mem.host_peak_bytes
    child = subprocess.Popen([sys.executable, "-c", HOLD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        mem._sample()  # one sample while the child holds its memory
    finally:
        child.stdin.close()
        child.wait()
    mem.stop()
    assert mem.host_peak_bytes - own >= 280 * MIB
