"""Peak memory: host RSS sampled in a background thread, device peak from CUDA's allocator.

Host memory is the resident set of this process **plus its child processes** (DataLoader
workers with ``run.loader.num_workers > 0``), summed at each sample; pages a forked worker
shares with its parent count once per process, so with workers the figure is an upper bound.
Prefect's temporary API server, a child of a run started without ``PREFECT_API_URL``, is
harness, not workload, and is not counted.

A compiled CPU run also starts Inductor's compiler processes (its compile-worker pool, g++ and
its cc1plus/as/ld, an ISA probe). They are counted in ``host_peak_bytes`` (the run needed that
memory) and left out of ``host_peak_excluding_compiler_bytes``: they live for tens to hundreds
of milliseconds at a few hundred MB each, so whether a 20 ms sampler catches two of them at once
moves the first figure by 30%+ between two identical runs, while the second is repeatable.

A child is counted once this sampler has seen it for ``MIN_CHILD_AGE_S``: between fork and exec, a subprocess
(every g++ Inductor starts) reports the parent's whole resident set, pages it only shares; one
such sample once added 850 MB to a 900 MB run. Roles are read at every sample, since exec
changes what a process is under the same pid.
"""

from __future__ import annotations

import threading

import psutil
import torch

from tasks.measure.clock import wall_clock

PREFECT_SERVER = "prefect.server.api.server"  # in the temporary server's uvicorn command line
# Inductor's compiler: the GCC driver and the tools it runs, by process name
COMPILER_NAMES = frozenset({"g++", "gcc", "c++", "cc", "cc1", "cc1plus", "as", "ld", "collect2", "openssl"})
# ... and Inductor's Python helpers, by command line: the compile-worker pool and the vector-ISA probe
COMPILER_COMMANDS = ("torch/_inductor/compile_worker", "torch._inductor.compile_worker", "cdll.LoadLibrary")
HARNESS, COMPILER, WORKLOAD = "harness", "compiler", "workload"
MIN_CHILD_AGE_S = 0.05  # longer than any fork-to-exec window


def role(child: psutil.Process) -> str:
    """What a child process of the benchmark is: harness (not counted), compiler or workload."""
    name = child.name()
    if name in COMPILER_NAMES:
        return COMPILER
    command = " ".join(child.cmdline())
    if PREFECT_SERVER in command:
        return HARNESS
    if any(c in command for c in COMPILER_COMMANDS):
        return COMPILER
    return WORKLOAD


class PeakMemory:
    """Samples the RSS of this process tree every ``interval`` seconds between ``start`` and ``stop``."""

    def __init__(self, device: torch.device | None = None, interval: float = 0.02) -> None:
        self.device = device
        self.interval = interval
        self.host_peak_bytes = 0
        self.host_peak_excluding_compiler_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc = psutil.Process()
        # (pid, create time, name) -> role: a reused pid or an exec gets a fresh look
        self._roles: dict[tuple[int, float, str], str] = {}
        # (pid, create time) -> when first seen, on the harness's wall clock (psutil's create_time
        # is derived from a whole-second boot time, too coarse to age a child by)
        self._first_seen: dict[tuple[int, float], float] = {}

    def _role(self, child: psutil.Process) -> str:
        key = (child.pid, child.create_time(), child.name())
        if key not in self._roles:
            self._roles[key] = role(child)
        return self._roles[key]

    def _sample(self) -> None:
        workload = self._proc.memory_info().rss
        compiler = 0
        now = wall_clock()
        for child in self._proc.children(recursive=True):
            try:
                if now - self._first_seen.setdefault((child.pid, child.create_time()), now) < MIN_CHILD_AGE_S:
                    continue
                rss = child.memory_info().rss
                kind = self._role(child)  # after the read: an exec in between shows here
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue  # exited between listing and reading
            if kind == WORKLOAD:
                workload += rss
            elif kind == COMPILER:
                compiler += rss
        self.host_peak_bytes = max(self.host_peak_bytes, workload + compiler)
        self.host_peak_excluding_compiler_bytes = max(self.host_peak_excluding_compiler_bytes, workload)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> PeakMemory:
        self._sample()
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._thread = threading.Thread(target=self._loop, name="relflow-rss", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()

    @property
    def device_peak_bytes(self) -> int:
        if self.device is not None and self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return 0
