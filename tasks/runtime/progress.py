"""Progress events from the flow body to whoever shows them (the CLI's Rich display).

A module-level listener keeps the flow's parameters plain data (Prefect validates them)
while the CLI still sees each stage as it starts and ends.

Counts (issue 41, item 5): a phase that runs batches or requests (training epochs, predict
passes, a request run) opens a ``Count`` with ``begin``, whose total is known before it starts
(from the plan: chunk rows and ``run.batch_size``) or marked not exact; the loop adds to it with
``tick``, which only adds two integers to a live object: nothing is rendered, queued or timed on
the loop's thread. The display reads the object when it redraws (Rich's refresh thread). With no
listener ``begin`` opens nothing and ``tick`` returns at once (``tests/tasks/runtime/test_progress.py``
checks both; ``benchmarks/bench_progress.py`` prices a tick against a steady batch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Listener = Callable[[str, dict[str, Any]], None]
_listeners: list[Listener] = []


def subscribe(listener: Listener) -> Callable[[], None]:
    _listeners.append(listener)
    return lambda: _listeners.remove(listener)


def emit(event: str, **info: Any) -> None:
    for listener in list(_listeners):
        listener(event, info)


def listening() -> bool:
    """Whether anyone shows progress (the CLI on a terminal)."""
    return bool(_listeners)


@dataclass
class Count:
    """Batches (or requests) of one phase, counted as they run: ``done`` of ``total``.

    ``total`` is None when unknown; ``exact`` False when it is an estimate (a training epoch's
    batches before every chunk was split into training and held-out rows), which the display
    says. ``rows`` are root rows through the counted steps (rows/s)."""

    phase: str  # train | predict | single_stream | server
    total: int | None
    exact: bool = True
    unit: str = "batches"  # batches | requests
    done: int = 0
    rows: int = 0


_count: Count | None = None


def begin(phase: str, total: int | None, *, exact: bool = True, unit: str = "batches") -> Count | None:
    """Open the count of a phase (None, and nothing else, when no one listens); listeners get
    a ``count`` event with the object, which they read when they redraw."""
    global _count
    if not _listeners:
        _count = None
        return None
    _count = Count(phase, total, exact, unit)
    emit("count", count=_count)
    return _count


def tick(rows: int, steps: int = 1) -> None:
    """``steps`` batches or requests of ``rows`` root rows done: two additions, no call out."""
    c = _count
    if c is not None:
        c.done += steps
        c.rows += rows


def end() -> None:
    """Close the open count (the region is over: later passes are not the run's)."""
    global _count
    _count = None
