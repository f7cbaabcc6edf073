"""The one place that reads clocks.

Every timed region in the harness goes through ``Clock``: ``perf_counter`` with the device
synchronised first, so asynchronous CUDA work is charged to the region that launched it.
Tests swap in a fake clock; nothing else in the code base calls ``time`` directly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a device is named: the CLI's checks run before it
    import torch


def synchronize(device: torch.device | str | None) -> None:
    """Wait for queued device work; a no-op on CPU."""
    if device is None:
        return
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Span:
    seconds: float = 0.0


@dataclass
class Clock:
    """Synchronising stopwatch. ``now`` is swappable for deterministic tests."""

    device: torch.device | str | None = None
    now: Callable[[], float] = field(default=time.perf_counter)
    # Request scenarios wait for scheduled arrivals; tests swap in a fake that advances ``now``.
    sleep: Callable[[float], None] = field(default=time.sleep)

    def read(self) -> float:
        synchronize(self.device)
        return self.now()

    @contextmanager
    def measure(self) -> Iterator[Span]:
        span = Span()
        start = self.read()
        try:
            yield span
        finally:
            span.seconds = self.read() - start


def wall_clock() -> float:
    """Unsynchronised wall time for waits and harness overhead (no device work inside)."""
    return time.perf_counter()


def unix_time() -> float:
    """Seconds since the epoch, for timestamps that must compare across processes."""
    return time.time()
