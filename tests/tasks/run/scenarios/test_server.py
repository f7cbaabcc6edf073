"""The server's bookkeeping is settled a bounded amount per idle gap (issue 43 item 10).

A scripted clock moves only when the stub server serves (1 s a call), sleeps, or settles a
served call's bookkeeping (``BOOK`` s a call). On the old code the first idle gap after a
busy spell settled the whole backlog at once, and the next arrival queued behind it: here a
burst of six requests left 1.5 s of bookkeeping in front of an arrival due 0.5 s later, which
was issued 1.0 s late. Now a gap settles at most ``SETTLE_CALLS_PER_GAP`` calls, each begun
before the next arrival is due; every call is still settled, once, in order; and the settling
seconds are ``LatencyRecord.settle_s`` (``harness.request_settle_seconds``), so the scenario's
seconds are service, waits and settling, each in one place.
"""

from __future__ import annotations

import numpy as np
import pytest

from tasks.run.scenarios import server
from tests.tasks.run.scenarios.test_latency import FakeTime, keys_for

SERVE, BOOK = 1.0, 0.25  # seconds per served call and per call's bookkeeping (dyadic: exact sums)


class Backlog(FakeTime):
    """Stub serving path: each call leaves one call's bookkeeping pending; ``settle`` runs the
    oldest ones, ``BOOK`` seconds each, and notes when each settle call began."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[int] = []  # served call numbers whose bookkeeping waits
        self.settled: list[int] = []
        self.settles: list[tuple[float, int]] = []  # (time it began, calls it settled)
        self.slept = 0.0
        self.service = 0.0

    def sleep(self, seconds: float) -> None:
        self.slept += seconds
        super().sleep(seconds)

    def serve(self, keys: np.ndarray) -> dict[str, float]:
        self.served.append((self.t, keys.tolist()))
        self.pending.append(len(self.served) - 1)
        self.t += SERVE
        self.service += SERVE
        return {"compute": SERVE}

    def settle(self, calls: int | None = None, /) -> int:
        n = len(self.pending) if calls is None else min(calls, len(self.pending))
        self.settles.append((self.t, n))
        for _ in range(n):
            self.settled.append(self.pending.pop(0))
            self.t += BOOK
        return len(self.pending)


def _run(bl: Backlog, arrivals: list[float], **kwargs: object):
    a = np.array(arrivals)
    return server.run(bl.serve, a, keys_for(len(a)), bl.clock, max_batch=1, max_wait_s=0.0, settle=bl.settle, **kwargs)


def _gap_settles(bl: Backlog, arrivals: list[float]) -> list[tuple[float, int, float]]:
    """Settle calls made while the server was idle: (began, calls settled, next arrival due)."""
    start = bl.served[0][0]  # the schedule starts at the first served call (no cold request here)
    out = []
    for began, n in bl.settles[:-1]:  # the last one is the end's
        due = next(t for t in arrivals if start + t > began - 1e-12)
        out.append((began, n, start + due))
    return out


def test_a_backlog_is_settled_a_bounded_amount_per_idle_gap_and_never_delays_an_arrival():
    # six at once (a burst: served back to back, 0..6 s), then one every 2.5 s
    arrivals = [0.0] * 6 + [6.5, 9.0, 11.5, 14.0]
    bl = Backlog()
    rec = _run(bl, arrivals)
    # the first gap (6.0 .. 6.5 s) holds two calls' worth of the six pending: the arrival due
    # at 6.5 s is issued on time (the old code settled all six there: 1.0 s late)
    assert rec.lateness_s == [0.0] * len(arrivals)
    per_gap: dict[float, int] = {}
    for began, n, due in _gap_settles(bl, arrivals):
        assert began < due, "a settle began once the next arrival was due"
        per_gap[due] = per_gap.get(due, 0) + n
    assert per_gap[6.5] == 2
    assert max(per_gap.values()) <= server.SETTLE_CALLS_PER_GAP == 2
    assert rec.latency_s[6:] == [SERVE] * 4
    # every call's bookkeeping ran once, in the order served, what the gaps left at the end
    assert bl.settled == list(range(len(arrivals)))
    assert bl.settles[-1][1] == len(arrivals) - sum(per_gap.values()) > 0
    # every scripted second is service, an idle wait or settling, and each is counted once
    assert rec.settle_s == BOOK * len(arrivals)
    assert rec.wait_s == bl.slept
    assert bl.t == bl.service + bl.slept + rec.settle_s


def test_a_gap_shorter_than_a_calls_bookkeeping_settles_one_at_most():
    # a burst of three, then an arrival 0.1 s after the server is free: one call's bookkeeping
    # is begun before it is due and none after, so it is issued at most one call's worth late
    arrivals = [0.0, 0.0, 0.0, 3.1, 3.1 + 4 * SERVE]
    bl = Backlog()
    rec = _run(bl, arrivals)
    (first, *_) = _gap_settles(bl, arrivals)
    assert first[:2] == (3.0, 1)
    assert rec.lateness_s[3] == pytest.approx(3.0 + BOOK - 3.1)
    assert max(rec.lateness_s) <= BOOK
    assert bl.settled == list(range(len(arrivals)))


@pytest.mark.parametrize("per_gap", [1, 3])
def test_the_bound_per_gap_is_the_servers_argument(per_gap):
    arrivals = [0.0] * 6 + [20.0, 40.0]  # long gaps: only the bound stops the settling
    bl = Backlog()
    _run(bl, arrivals, settle_calls=per_gap)
    gaps = _gap_settles(bl, arrivals)
    settled_in_first_gap = sum(n for _, n, due in gaps if due == 20.0)
    assert settled_in_first_gap == per_gap
    assert bl.settled == list(range(len(arrivals)))


def test_the_cold_requests_bookkeeping_is_settled_before_the_schedule_and_timed():
    bl = Backlog()
    a = np.array([0.0, 5.0])
    rec = server.run(
        bl.serve, a, keys_for(2), bl.clock, max_batch=1, max_wait_s=0.0, cold_keys=np.array([9]), settle=bl.settle
    )
    assert bl.settles[0] == (SERVE, 1)  # right after the cold call, before the schedule's clock starts
    assert rec.first_latency_s == SERVE  # the cold request's latency holds none of it
    assert rec.settle_s == BOOK * 3 and bl.settled == [0, 1, 2]
