"""Signal a CLI subprocess once its temporary output exists (the interrupt tests of the
file-writing commands share it; tasks/runtime/interrupts.py is what they test)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tasks.measure.clock import wall_clock


def terminate_when(
    args: list[str], cwd: Path, started: Callable[[int], bool], env: dict[str, str]
) -> tuple[int, str, float, list[list[str]]]:
    """Run the CLI, SIGTERM it as soon as ``started(pid)``; returns (exit code, stderr, seconds
    from the signal to the exit, command lines of its children still alive after it)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=cwd,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not started(proc.pid):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(
                f"the command ended ({proc.returncode}) before it was ready for the signal (temporary output, handler)"
            )
        time.sleep(0.005)
    children = psutil.Process(proc.pid).children(recursive=True)
    sent = wall_clock()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    seconds = wall_clock() - sent
    alive = [c.cmdline() for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    return proc.returncode, err, seconds, alive


def catches_sigterm(pid: int) -> bool:
    """The process has installed a SIGTERM handler (bit 15 of SigCgt in /proc): for commands
    whose temporary file lives too briefly to be seen, the signal then arrives mid-work."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))
