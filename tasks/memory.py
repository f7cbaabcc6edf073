"""Peak memory: host RSS sampled in a background thread, device peak from CUDA's allocator."""

from __future__ import annotations

import threading

import psutil
import torch


class PeakMemory:
    """Samples this process's RSS every ``interval`` seconds between ``start`` and ``stop``."""

    def __init__(self, device: torch.device | None = None, interval: float = 0.02) -> None:
        self.device = device
        self.interval = interval
        self.host_peak_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc = psutil.Process()

    def _sample(self) -> None:
        self.host_peak_bytes = max(self.host_peak_bytes, self._proc.memory_info().rss)

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
