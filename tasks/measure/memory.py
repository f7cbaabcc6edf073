"""Peak memory: host peak from the kernel's own high-water marks, device peak from CUDA's allocator.

Host memory is the resident set of this process **plus its child processes** (DataLoader
workers with ``run.loader.num_workers > 0``, Inductor's compiler processes). The kernel keeps
the figures, so the harness does not have to catch a peak in the act:

- this process: ``VmHWM`` (/proc/self/status), its peak resident set, reset at ``start`` by
  writing ``5`` to /proc/self/clear_refs, so it is the peak of the measured window. Where the
  kernel refuses the reset (a container that mounts /proc read-only, an older kernel), ``VmHWM``
  is the process's lifetime peak: once it rises above its value at ``start`` the window set a
  new lifetime peak, which is then the window's peak too; until it does, the window's peak is
  below that mark and the current resident set at each sample is the figure (a spike between
  samples that stays below an earlier peak is then missed);
- live children: each child's own ``VmHWM``, read at each sample, **minus the pages it shares**
  (``Shared_Clean + Shared_Dirty`` of /proc/<pid>/smaps_rollup: pages another process maps
  too; re-read about once a second, ``SHARED_REFRESH_S``, since the read walks the child's page
  tables). A child's figure is its peak so far, so a worker that spikes between two
  samples is still counted; the pages a forked worker shares with its parent (the whole
  dataset array a DataLoader worker inherits and only reads) are in the parent's figure
  already and are not counted again. Summing each child's full resident set instead made two
  forked workers over a 200 MB array read about 3x the memory the host used;
- children that exited: ``ru_maxrss`` of the reaped children (``getrusage(RUSAGE_CHILDREN)``),
  the largest peak of any descendant this process (or a reaped child of it) waited for. It
  only says something when it rose during the window (it is never reset) **above every peak
  a sample saw** (a sampled child is counted already, shared pages once; a forked worker's
  peak, shared pages and all, rises into ``ru_maxrss`` when it is reaped), and then an unseen
  child was one of ours: a 300 MB compiler process that lives 50 ms between two samples is
  counted, in full (nothing says any more which of its pages were shared). Only **above this
  process's own peak**, though: a fork/exec child's ``ru_maxrss`` includes the parent pages it
  mapped before its exec (the kernel keeps the old address space's high-water mark at exec;
  after ``vfork``/``posix_spawn`` that is the parent's own), so any short subprocess, a
  ``true``, reaps as about the parent's resident set and once added it to the figure again. A
  residue is never above the parent's peak; an unseen child that peaked below it cannot be
  told from one and is not counted (the live-child samples, every 0.1 s, count those that live).

So the figure is the parent's peak plus each child's peak of the pages only it maps: pages
the tree shares with its parent count once, pages two children share with each other but not
with the parent are not counted (none such in a DataLoader or Inductor tree; a PSS sum would
split them, but PSS has no high-water mark to catch a spike with). The sum of peaks reached
at different moments is an upper bound of the true simultaneous peak.
Prefect's temporary API server, a child of a run started without ``PREFECT_API_URL``, is
harness, not workload, and is not counted (it is reaped at exit, after the window).

A compiled CPU run also starts Inductor's compiler processes (its compile-worker pool, g++ and
its cc1plus/as/ld, an ISA probe). They are counted in ``host_peak_bytes`` (the run needed that
memory) and left out of ``host_peak_excluding_compiler_bytes``, the repeatable figure to
compare compiled runs on. A reaped child cannot be told apart by role any more, so the
reaped-children peak counts in ``host_peak_bytes`` only (live workload children, which live for
the whole window, are counted in both).

A child is counted once this sampler has seen it for ``MIN_CHILD_AGE_S``: between fork and
exec, a subprocess (every g++ Inductor starts) reports the parent's whole resident set, pages
it only shares; one such sample once added 850 MB to a 900 MB run. Roles are read at every
sample, since exec changes what a process is under the same pid.

Footprint: the sampler wakes every ``interval`` (0.1 s) while children exist and every
``IDLE_INTERVAL_S`` (1 s) while none do, and lists children through
/proc/<pid>/task/<tid>/children (the process's own tree, not every process on the host).
A child's shared pages (smaps_rollup, the one costly read) are re-read at most once a second
and never more often than 50x the read's own time, so they cost at most about 2% of a core.
The sampler before this (a 20 ms walk of all of /proc) cost the model measurable throughput on
a 2-core host: benchmarks/bench_crosscheck.py measures each side activity's cost.
"""

from __future__ import annotations

import os
import re
import resource
import threading
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from tasks.measure import keys as K
from tasks.measure.clock import wall_clock

PREFECT_SERVER = "prefect.server.api.server"  # in the temporary server's uvicorn command line
# Inductor's compiler: the GCC driver and the tools it runs, by process name
COMPILER_NAMES = frozenset({"g++", "gcc", "c++", "cc", "cc1", "cc1plus", "as", "ld", "collect2", "openssl"})
# ... and Inductor's Python helpers, by command line: the compile-worker pool and the vector-ISA probe
COMPILER_COMMANDS = ("torch/_inductor/compile_worker", "torch._inductor.compile_worker", "cdll.LoadLibrary")
HARNESS, COMPILER, WORKLOAD = "harness", "compiler", "workload"
MIN_CHILD_AGE_S = 0.05  # longer than any fork-to-exec window
INTERVAL_S = 0.1  # while children exist: their high-water marks catch what happens in between
IDLE_INTERVAL_S = 1.0  # while none do: only to notice a new one (one that exits first is reaped)
# A child's shared pages are re-read at most this often, and never more often than 50x the read
# took: smaps_rollup walks the child's page tables (40 ms for a 500 MB worker on a loaded 2-core
# host, against 0.3 ms for VmHWM). New pages show at once in VmHWM; only pages a worker stops
# sharing (copy-on-write) show up to one refresh late.
SHARED_REFRESH_S = 1.0
SHARED_READ_BUDGET = 50
KIB = 1024
_HWM = re.compile(rb"VmHWM:\s+(\d+) kB")
_RSS = re.compile(rb"VmRSS:\s+(\d+) kB")
_SHARED = re.compile(rb"Shared_(?:Clean|Dirty|Hugetlb):\s+(\d+) kB")


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


def high_water_bytes(pid: int | str = "self") -> int:
    """The process's peak resident set (``VmHWM``); its current one where the kernel has no HWM."""
    status = Path(f"/proc/{pid}/status").read_bytes()
    m = _HWM.search(status) or _RSS.search(status)
    return int(m.group(1)) * KIB if m else 0


def shared_bytes(pid: int | str = "self") -> int:
    """Resident bytes of ``pid`` that another process maps too (its resident set minus its USS)."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_bytes()
    except FileNotFoundError:  # a kernel before 4.14: psutil adds up /proc/<pid>/smaps (slower)
        full = psutil.Process(int(pid) if pid != "self" else None).memory_full_info()
        return int(full.rss - full.uss)
    return sum(int(m) for m in _SHARED.findall(rollup)) * KIB


def reset_high_water() -> bool:
    """Reset this process's ``VmHWM`` to its current resident set; False where not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def reaped_children_peak_bytes() -> int:
    """Largest peak resident set of any descendant reaped so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * KIB


def child_pids(pid: int) -> list[int]:
    """Every descendant of ``pid``, from the kernel's per-thread children lists."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue  # exited
        for tid in tids:
            try:
                kids = [int(k) for k in Path(f"/proc/{p}/task/{tid}/children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


@dataclass(frozen=True)
class MemoryPeaks:
    """One measured window's peaks (``PeakMemory.stop``): the host's (this process tree), the
    same without the compiler's processes, and the CUDA allocator's."""

    host_bytes: int = 0
    host_excluding_compiler_bytes: int = 0
    device_bytes: int = 0

    def metrics(self) -> dict[str, float]:
        return {
            K.HOST_PEAK_BYTES: float(self.host_bytes),
            K.HOST_PEAK_EXCLUDING_COMPILER_BYTES: float(self.host_excluding_compiler_bytes),
            K.DEVICE_PEAK_BYTES: float(self.device_bytes),
        }


class PeakMemory:
    """Peak resident memory of this process tree between ``start`` and ``stop``."""

    def __init__(self, device: torch.device | None = None, interval: float = INTERVAL_S) -> None:
        self.device = device
        self.interval = interval
        self.idle_interval = max(interval, IDLE_INTERVAL_S)
        self.host_peak_bytes = 0
        self.host_peak_excluding_compiler_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._has_children_file = Path(f"/proc/{self._pid}/task/{self._pid}/children").exists()
        self._own_hwm = False  # VmHWM reset at start: it is this window's peak
        self._own_hwm_at_start = 0  # VmHWM at start where the reset was refused (a lifetime peak)
        self._reaped_at_start = 0
        self._largest_child_seen = 0  # the largest child VmHWM a sample read (ru_maxrss's rival)
        # (pid, create time, name) -> (shared bytes, when to read them again): an exec re-reads
        self._shared: dict[tuple[int, float, str], tuple[int, float]] = {}
        self._children_seen = False
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

    def _children(self) -> list[psutil.Process]:
        if not self._has_children_file:  # a kernel without CONFIG_PROC_CHILDREN
            kids: list[psutil.Process] = psutil.Process(self._pid).children(recursive=True)
            return kids
        out = []
        for pid in child_pids(self._pid):
            try:
                out.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        return out

    def _shared_bytes(self, child: psutil.Process, now: float) -> int:
        """The child's shared pages, re-read when the last read is old enough (see SHARED_REFRESH_S)."""
        key = (child.pid, child.create_time(), child.name())
        cached = self._shared.get(key)
        if cached is not None and now < cached[1]:
            return cached[0]
        t0 = wall_clock()
        shared = shared_bytes(child.pid)
        took = wall_clock() - t0
        self._shared[key] = (shared, now + max(SHARED_REFRESH_S, SHARED_READ_BUDGET * took))
        return shared

    def _own_bytes(self) -> int:
        """This process's peak in the window: ``VmHWM`` after a reset; without one, ``VmHWM`` once
        it rose above its value at start (a new lifetime peak, reached in the window), else the
        current resident set."""
        hwm = high_water_bytes()
        if self._own_hwm:
            return hwm
        rss = int(psutil.Process(self._pid).memory_info().rss)
        return max(rss, hwm) if hwm > self._own_hwm_at_start else rss

    def _sample(self) -> None:
        own = self._own_bytes()
        workload, compiler = own, 0
        now = wall_clock()
        children = self._children()
        self._children_seen = bool(children)
        for child in children:
            try:
                if now - self._first_seen.setdefault((child.pid, child.create_time()), now) < MIN_CHILD_AGE_S:
                    continue
                hwm = high_water_bytes(child.pid)
                kind = self._role(child)  # after the read: an exec in between shows here
                if kind == HARNESS:
                    continue
                # what the child adds to the tree: its peak less the pages it shares (in the parent's)
                peak = max(hwm - self._shared_bytes(child, now), 0)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
                continue  # exited between listing and reading
            self._largest_child_seen = max(self._largest_child_seen, hwm)  # Prefect's server never counts
            if kind == WORKLOAD:
                workload += peak
            elif kind == COMPILER:
                compiler += peak
        total = workload + compiler
        reaped = reaped_children_peak_bytes()
        # a child reaped in this window whose peak no sample saw: an unseen child, and ours. Not
        # above this process's own peak it may be nothing but the parent pages a fork/exec child
        # reports before its exec (a 300 MB parent's `true` reaps as ~300 MB): not counted.
        if reaped > max(self._reaped_at_start, self._largest_child_seen, own):
            total = max(total, own + reaped)
        self.host_peak_bytes = max(self.host_peak_bytes, total)
        self.host_peak_excluding_compiler_bytes = max(self.host_peak_excluding_compiler_bytes, workload)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval if self._children_seen else self.idle_interval):
            self._sample()

    def start(self) -> PeakMemory:
        self._own_hwm = reset_high_water()
        self._own_hwm_at_start = 0 if self._own_hwm else high_water_bytes()
        self._reaped_at_start = reaped_children_peak_bytes()
        self._sample()
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._thread = threading.Thread(target=self._loop, name="relflow-rss", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> MemoryPeaks:
        """The window's peaks, sampled once more as it ends."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        return MemoryPeaks(self.host_peak_bytes, self.host_peak_excluding_compiler_bytes, self.device_peak_bytes)

    @property
    def device_peak_bytes(self) -> int:
        if self.device is not None and self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return 0
