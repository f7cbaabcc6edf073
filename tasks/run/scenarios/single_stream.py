"""single_stream: one request at a time, the next issued when the previous one is written.

The first request is cold (first predict call, caches) and is recorded apart. Steady
requests follow until both ``min_requests`` and ``min_duration_s`` are reached (LoadGen's
rule), or ``max_requests`` when given (tests).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from tasks.measure.clock import Clock, unix_time
from tasks.run.scenarios.latency import LatencyRecord

Serve = Callable[[np.ndarray], dict[str, float]]


def run(
    serve: Serve,
    keys: Iterator[np.ndarray],
    clock: Clock,
    *,
    min_requests: int,
    min_duration_s: float,
    roots: int = 1,
    max_requests: int | None = None,
    settle: Callable[[], object] = lambda: None,
    on_served: Callable[[int, int, float], object] = lambda requests, roots, elapsed: None,
) -> LatencyRecord:
    """``settle`` runs after each request's span: the serving path's bookkeeping, which no
    request's latency includes (the scenario's duration does: it is wall time); its seconds
    go to ``rec.settle_s`` (``harness.request_settle_seconds``). ``on_served(requests, roots,
    elapsed)`` after each steady request, outside its span: the progress count and the run's
    projection (tasks/run/scenarios/pricing.py)."""
    rec = LatencyRecord("single_stream", roots=roots)
    with clock.measure() as cold:
        rec.first_steps_s = serve(next(keys))
    rec.first_latency_s = cold.seconds
    with clock.measure() as booked:
        settle()
    rec.settle_s += booked.seconds
    start = clock.read()
    rec.start_unix = unix_time()
    elapsed = 0.0
    while rec.requests < min_requests or elapsed < min_duration_s:
        if max_requests is not None and rec.requests >= max_requests:
            break
        request = next(keys)
        with clock.measure() as span:
            steps = serve(request)
        # Issued just after the previous read of the loop (no extra clock read per request).
        rec.add(span.seconds, 0.0, steps, start=elapsed)
        rec.request_keys.append(request)
        rec.served(steps, len(request))
        with clock.measure() as booked:
            settle()
        rec.settle_s += booked.seconds
        elapsed = clock.read() - start
        on_served(1, len(request), elapsed)
    rec.duration_s = elapsed
    return rec
