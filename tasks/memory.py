"""Peak memory: host RSS sampled in a background thread, device peak from CUDA's allocator.

Host memory is the resident set of this process **plus its child processes** (DataLoader
workers with ``run.loader.num_workers > 0``), summed at each sample; pages a forked worker
shares with its parent count once per process, so with workers the figure is an upper bound.
Prefect's temporary API server, a child of a run started without ``PREFECT_API_URL``, is
harness, not workload, and is not counted.
"""

from __future__ import annotations

import threading

import psutil
import torch

PREFECT_SERVER = "prefect.server.api.server"  # in the temporary server's uvicorn command line


class PeakMemory:
    """Samples the RSS of this process tree every ``interval`` seconds between ``start`` and ``stop``."""

    def __init__(self, device: torch.device | None = None, interval: float = 0.02) -> None:
        self.device = device
        self.interval = interval
        self.host_peak_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc = psutil.Process()
        self._harness: dict[int, bool] = {}  # child pid -> is Prefect's temporary server

    def _counted(self, child: psutil.Process) -> bool:
        """Not Prefect's temporary API server: a run started without PREFECT_API_URL spawns it as
        a child, a sweep's configuration (or a run against a real server) does not."""
        if child.pid not in self._harness:
            try:
                self._harness[child.pid] = any(PREFECT_SERVER in a for a in child.cmdline())
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                return False
        return not self._harness[child.pid]

    def _sample(self) -> None:
        rss = self._proc.memory_info().rss
        for child in self._proc.children(recursive=True):
            if not self._counted(child):
                continue
            try:
                rss += child.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass  # exited between listing and reading
        self.host_peak_bytes = max(self.host_peak_bytes, rss)

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
