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
    child = subprocess.Popen([sys.executable, "-c", HOLD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        mem._sample()  # one sample while the child holds its memory
    finally:
        child.stdin.close()
        child.wait()
    mem.stop()
    assert mem.host_peak_bytes - own >= 280 * MIB


# Run in a fresh interpreter: pytest's own process tree holds session services (MLflow servers,
# browsers) whose memory would swamp the 300 MiB this test tells apart.
SERVER_VS_WORKER = """
import subprocess, sys, time
import psutil
from tasks.memory import PREFECT_SERVER, PeakMemory
code = "import time; b = bytearray(300 * 2**20); time.sleep(60)"
server = subprocess.Popen([sys.executable, "-c", code, PREFECT_SERVER + ":create_app"])
worker = subprocess.Popen([sys.executable, "-c", code])
try:
    for p in (server, worker):  # wait until each holds its 300 MiB
        while psutil.Process(p.pid).memory_info().rss < 300 * 2**20:
            time.sleep(0.05)
    mem = PeakMemory()
    own = psutil.Process().memory_info().rss
    mem.start()
    mem.stop()
    print(mem.host_peak_bytes - own)
finally:
    server.kill()
    worker.kill()
"""


def test_prefects_temporary_server_is_not_counted():
    """A standalone run's child uvicorn (Prefect's temporary server) is harness, not workload:
    a sweep child that uses the sweep's server must measure the same."""
    out = subprocess.run([sys.executable, "-c", SERVER_VS_WORKER], capture_output=True, text=True, check=True)
    counted = int(out.stdout.split()[-1])
    assert 300 * MIB <= counted < 500 * MIB  # the worker, not the server
