"""Other work on the host, measured from the OS CPU counters.

The 1-minute load average read at the end of a run is mostly the benchmark's own load, so
it cannot tell a busy host from a busy benchmark. Here the CPU time of the whole machine
(``psutil.cpu_times``: /proc/stat on Linux) minus the CPU time of this process tree is the
time other processes used. This process tree's CPU time is: our own, that of the children we
reaped, and, for every live descendant (DataLoader workers, a local Prefect server, Inductor's
compile-worker pool), its own time **plus that of the descendants it reaped**: a compile worker
that runs g++ and waits for it is still alive while g++'s (often larger) CPU time sits in the
worker's ``children_user|system``, and that time is ours, not other work:

- ``other_cpu_fraction_before(window)``: sampled over a short window just before the timed
  region, while the benchmark itself is idle;
- ``OtherCpu`` brackets the timed region and gives ``host.other_cpu_fraction``.

Both are a share of all cores (1.0 = every core busy with other work). Steal time (another
virtual machine on the same host) counts as other work: it is CPU taken from this run.
"""

from __future__ import annotations

import os
import time

import psutil

from tasks.measure.clock import wall_clock

# Above this share of the cores taken by other work, a measured peak or floor ledger is not
# cached (tasks/run/peak_flops.py, floors.py) and a run's floor fractions are untrusted.
BUSY_HOST_FRACTION = 0.1


def busy_cpu_seconds() -> float:
    """CPU seconds all cores spent not idle since boot."""
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    # guest time is already inside user time on Linux
    total = sum(getattr(t, f) for f in t._fields if f not in ("guest", "guest_nice"))
    return float(total - idle)


def own_cpu_seconds() -> float:
    """CPU seconds of this process tree: this process, its live descendants, and every
    descendant any of them reaped (a reaped process's time moves into its reaper's
    ``children_*``; a live process's own ``children_*`` holds only reaped ones, so nothing
    counts twice)."""
    proc = psutil.Process()
    t = proc.cpu_times()
    own = t.user + t.system + t.children_user + t.children_system
    for child in proc.children(recursive=True):
        try:
            c = child.cpu_times()
            own += c.user + c.system + c.children_user + c.children_system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return float(own)


class OtherCpu:
    """CPU share used by other processes between ``start()`` and ``stop()``."""

    def __init__(self) -> None:
        self.fraction = 0.0
        self._start: tuple[float, float, float] | None = None

    def start(self) -> OtherCpu:
        self._start = (wall_clock(), busy_cpu_seconds(), own_cpu_seconds())
        return self

    def stop(self) -> float:
        assert self._start is not None, "start() first"
        w0, b0, o0 = self._start
        wall = wall_clock() - w0
        other = (busy_cpu_seconds() - b0) - (own_cpu_seconds() - o0)
        cores = os.cpu_count() or 1
        # The OS counts in clock ticks (10 ms): over short windows the share can overshoot.
        self.fraction = min(max(other, 0.0) / (wall * cores), 1.0) if wall > 0 else 0.0
        return self.fraction


def other_cpu_fraction_before(window_s: float = 0.5) -> float:
    """Share of all cores other processes used over ``window_s`` seconds, now."""
    share = OtherCpu().start()
    time.sleep(window_s)  # the benchmark waits; only other work shows up
    return share.stop()
