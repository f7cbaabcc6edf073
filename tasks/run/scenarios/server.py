"""server: open-loop arrivals on a schedule fixed up front; one server, dynamic batching.

Arrivals never wait for the server (open loop): request ``i`` arrives at ``arrivals[i]``
seconds after the start whatever happens. The server takes the queued requests when it is
free: all of them up to ``max_batch``, after waiting at most ``max_wait_s`` past the oldest
one's arrival for the batch to fill. A request's latency runs from its scheduled arrival to
the end of its batch's write step, so time spent queued is counted. The cold first request
is served, and recorded apart, before the schedule starts.

Issue lateness: the generator and the server share one thread (and, here, two cores), so a
request is issued when the driver notices it. Its lateness is how long after it could have
been noticed that was: after its arrival, or after the batch that was being served when it
arrived ended. A request arriving during a batch is queued by the schedule, not late (its
latency counts from the arrival anyway); a late wake from sleeping is the generator's delay.

Bookkeeping (``settle``: what a served call counts, tasks/run/scenarios/request.py) runs while the
server is idle, bounded per idle gap: at most ``settle_calls`` served calls' worth
(``SETTLE_CALLS_PER_GAP``), each begun only before the next arrival is due. Settling the whole
backlog in the first gap after a busy spell made the next arrivals queue behind it near
saturation, the load peak-qps probes; now the most one gap's settling can delay an arrival is
one call's bookkeeping, and what is left waits for the next gaps and the end. Its seconds are
``LatencyRecord.settle_s`` (``harness.request_settle_seconds``), the cold request's and the
end's included.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

import numpy as np

from tasks.measure.clock import Clock, unix_time
from tasks.run.scenarios.latency import LatencyRecord

Serve = Callable[[np.ndarray], dict[str, float]]
SETTLE_CALLS_PER_GAP = 2  # served calls' bookkeeping settled at most per idle gap


class Settle(Protocol):
    """The serving path's bookkeeping (``RequestPath.settle``): run that of the ``calls``
    oldest served calls (None: every one); returns how many calls' bookkeeping is left."""

    def __call__(self, calls: int | None = None, /) -> int: ...


def _no_bookkeeping(calls: int | None = None, /) -> int:
    return 0


def run(
    serve: Serve,
    arrivals: np.ndarray,
    keys: np.ndarray,
    clock: Clock,
    *,
    max_batch: int,
    max_wait_s: float,
    cold_keys: np.ndarray | None = None,
    target_qps: float | None = None,
    settle: Settle = _no_bookkeeping,
    settle_calls: int = SETTLE_CALLS_PER_GAP,
    on_served: Callable[[int, int, float], object] = lambda requests, roots, elapsed: None,
) -> LatencyRecord:
    """``arrivals[i]`` (s from start) asks for ``keys[i]`` (a row of root keys). ``settle``
    (the serving path's bookkeeping) runs after the cold request, while the server is idle
    (at most ``settle_calls`` calls' worth per gap, each begun before the next arrival is
    due), and for what is left at the end: never between a batch's requests and their
    responses. Its seconds go to ``rec.settle_s``. ``on_served(requests, roots, elapsed)``
    after each served batch, outside every request's latency: the progress count and the run's
    projection (tasks/run/scenarios/pricing.py)."""
    n = len(arrivals)
    rec = LatencyRecord("server", target_qps=target_qps, roots=keys.shape[1])
    if cold_keys is not None:
        with clock.measure() as cold:
            rec.first_steps_s = serve(cold_keys)
        rec.first_latency_s = cold.seconds
        with clock.measure() as booked:
            settle()
        rec.settle_s += booked.seconds
    latency = np.zeros(n)
    queued = np.zeros(n)
    lateness = np.zeros(n)
    steps_of: list[dict[str, float]] = [{}] * n
    queue: deque[int] = deque()
    nxt = 0  # next request not yet arrived
    t0 = clock.read()
    rec.start_unix = unix_time()
    end = 0.0
    slept_to = 0.0  # a wait's target counts as reached: ``read() - t0`` can round just below it
    while nxt < n or queue:
        now = max(clock.read() - t0, slept_to)
        while nxt < n and arrivals[nxt] <= now:
            lateness[nxt] = now - max(arrivals[nxt], end)
            queue.append(nxt)
            nxt += 1
        if not queue:  # idle: the next arrival is in the future
            due = float(arrivals[nxt])
            with clock.measure() as booked:  # a bounded share of the backlog's bookkeeping
                for _ in range(settle_calls):
                    if max(clock.read() - t0, slept_to) >= due or settle(1) == 0:
                        break
            rec.settle_s += booked.seconds
            now = max(clock.read() - t0, slept_to)  # a settle that overran shows as lateness
            slept_to = float(arrivals[nxt])
            if slept_to <= now:
                continue
            with clock.measure() as idle:
                clock.sleep(slept_to - now)
            rec.wait_s += idle.seconds
            continue
        if len(queue) < max_batch and nxt < n:
            deadline = arrivals[queue[0]] + max_wait_s
            if now < deadline:  # wait for the batch to fill, or the oldest request's limit
                slept_to = float(min(deadline, arrivals[nxt]))
                with clock.measure() as idle:
                    clock.sleep(slept_to - now)
                rec.wait_s += idle.seconds
                continue
        batch = [queue.popleft() for _ in range(min(max_batch, len(queue)))]
        start = clock.read() - t0
        served = np.unique(keys[batch].reshape(-1))
        steps = serve(served)
        end = clock.read() - t0
        rec.served(steps, len(served))
        for i in batch:
            latency[i] = end - arrivals[i]
            queued[i] = start - arrivals[i]
            steps_of[i] = steps
        rec.batch_requests.append(len(batch))
        on_served(len(batch), len(served), end)
    with clock.measure() as booked:  # what the gaps left
        settle()
    rec.settle_s += booked.seconds
    for i in range(n):
        rec.add(float(latency[i]), float(queued[i]), steps_of[i], start=float(arrivals[i]))
    rec.duration_s = end
    rec.lateness_s = lateness.tolist()
    rec.request_keys = list(keys)
    return rec
