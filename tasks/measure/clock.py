"""The one place that reads clocks.

Every timed region in the harness goes through ``Clock``: ``perf_counter`` with the device
synchronised first, so asynchronous CUDA work is charged to the region that launched it.
Tests swap in a fake clock; nothing else in the code base calls ``time`` directly.

Per-batch spans of the compute loops go through ``Clock.window()`` instead. On CPU (and with
no device) a window's span is exactly ``Clock.measure`` and reports at once. On CUDA a span
records a pair of CUDA events on the current stream and does not wait: synchronising at every
read (four a batch: input wait and step) made steady GPU throughput synchronous throughput,
the host never queueing the next batch while the device ran this one. The window
synchronises once, on its last event, when the loop flushes it (every ``WINDOW_BATCHES``
steady batches and at the loop's end; first call and warm-up batches flush one by one, since
which batch is steady depends on them), and then reports each span's device seconds in
order: the stream time between the span's two events (device work queued between spans,
such as copying predictions back, is charged to none, as with the synchronising reads).
Unverified on a GPU host so far: the tests drive the
window logic with a fake event class.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, Self

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

    def window(self) -> Window:
        """Per-batch spans on CUDA events (CUDA devices), or this clock's own reads (else)."""
        if self.device is None:
            return Window(self, None)
        import torch

        if torch.device(self.device).type != "cuda":
            return Window(self, None)
        return Window(self, lambda: torch.cuda.Event(enable_timing=True))

    @contextmanager
    def measure(self) -> Iterator[Span]:
        span = Span()
        start = self.read()
        try:
            yield span
        finally:
            span.seconds = self.read() - start


WINDOW_BATCHES = 16  # steady batches timed per device synchronisation


class Event(Protocol):
    """What a window needs of ``torch.cuda.Event(enable_timing=True)``."""

    def record(self) -> None: ...
    def synchronize(self) -> None: ...
    def elapsed_time(self, end_event: Self) -> float: ...  # milliseconds


class Window:
    """Spans of one loop, timed on the device and read once per flush (see the module note).

    ``span(report)`` times its block; ``report(seconds)`` is called at the next ``flush()``,
    which the loop asks for through ``batch_done`` after each batch. ``new_event`` makes one
    timing event; ``None`` is the CPU path: the clock's own reads, flushed after every batch, so
    reports come exactly where the loop recorded them before windows."""

    def __init__(self, clock: Clock, new_event: Callable[[], Event] | None, batches: int = WINDOW_BATCHES) -> None:
        self.clock, self.new_event, self.batches = clock, new_event, batches
        self._pending: list[tuple[Callable[[], float], Callable[[float], None]]] = []
        self._last_end: Event | None = None
        self.syncs = 0  # device synchronisations (flushes with device spans pending)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _event(self) -> Event:
        assert self.new_event is not None
        e = self.new_event()
        e.record()
        return e

    @contextmanager
    def span(self, report: Callable[[float], None]) -> Iterator[None]:
        if self.new_event is None:
            with self.clock.measure() as s:
                yield
            self._pending.append((lambda: s.seconds, report))
            return
        start = self._event()
        yield
        end = self._last_end = self._event()
        self._pending.append((lambda: start.elapsed_time(end) / 1e3, report))

    def batch_done(self, steady: bool) -> None:
        """After each batch: flush on CPU, after a first-call or warm-up batch (the next batch's
        role depends on its time), and once ``batches`` steady batches are pending (two spans
        each: input wait and step)."""
        if self.new_event is None or not steady or len(self._pending) >= 2 * self.batches:
            self.flush()

    def flush(self) -> None:
        """Wait for the device once and report every pending span, in order."""
        if self._last_end is not None:
            self._last_end.synchronize()  # events complete in stream order: one wait covers all
            self._last_end = None
            self.syncs += 1
        pending, self._pending = self._pending, []
        for seconds, report in pending:
            report(seconds())


def wall_clock() -> float:
    """Unsynchronised wall time for waits and harness overhead (no device work inside)."""
    return time.perf_counter()


def unix_time() -> float:
    """Seconds since the epoch, for timestamps that must compare across processes."""
    return time.time()


def process_cpu() -> float:
    """CPU seconds of this process, every thread: on a loaded host a side-by-side benchmark
    compares the work two versions do, where wall time mostly measures the wait for a core."""
    return time.process_time()
