"""Which process holds a run, so that a later invocation can tell a live run from a dead one.

A run killed by SIGKILL or the out-of-memory killer cannot end itself and stays RUNNING in
MLflow. Each run records its process (``relflow.pid``, ``relflow.pid_start_unix_s``) and
host (``relflow.process_host``: a hash of the host name and machine id, plus
``relflow.boot_id``); a process is the same one only if its pid is alive *and* started at
the recorded time (pids are reused), on the same host, in the same boot.
"""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

import psutil

START_TOLERANCE_S = 1.0


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def process_host() -> str:
    ident = f"{socket.gethostname()}|{_read('/etc/machine-id') or _read('/var/lib/dbus/machine-id')}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def boot_id() -> str:
    return _read("/proc/sys/kernel/random/boot_id")


def process_tags(pid: int | None = None) -> dict[str, str]:
    """Tags that identify the process holding a run."""
    pid = pid or os.getpid()
    return {
        "relflow.pid": str(pid),
        "relflow.pid_start_unix_s": f"{psutil.Process(pid).create_time():.3f}",
        "relflow.process_host": process_host(),
        "relflow.boot_id": boot_id(),
    }


def is_alive(tags: dict[str, str]) -> bool:
    """Whether the process these tags name (recorded on this host) still runs."""
    recorded_boot = tags.get("relflow.boot_id", "")
    if recorded_boot and boot_id() and recorded_boot != boot_id():
        return False  # the host rebooted since
    try:
        pid = int(tags["relflow.pid"])
        start = float(tags["relflow.pid_start_unix_s"])
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return bool(abs(proc.create_time() - start) <= START_TOLERANCE_S)
    except psutil.AccessDenied:
        return True  # cannot be inspected (another user's process): never end a live run
    except (KeyError, ValueError, psutil.NoSuchProcess):
        return False
