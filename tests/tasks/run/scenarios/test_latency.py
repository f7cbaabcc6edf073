"""Scenario timing rules with a fake clock: the schedule is fixed by the seed, queueing counts
in latency, requests waiting together are served together, the cold request stays apart."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.measure.clock import Clock
from tasks.run.scenarios import server, single_stream
from tasks.run.scenarios.latency import STEPS, LatencyRecord, verdict
from tasks.run.scenarios.schedule import poisson_arrivals, request_keys
from tasks.spec import Request
from tests.tasks.run.scenarios.test_early_stopping import SERVER_CASES, scipy_server_passes


class FakeTime:
    """A clock that only moves when the server works (``serve``) or waits (``sleep``)."""

    def __init__(self) -> None:
        self.t = 0.0
        self.clock = Clock(None, now=lambda: self.t, sleep=self.sleep)
        self.served: list[tuple[float, list[int]]] = []

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0, "the driver never sleeps a negative time"
        self.t += seconds

    def server(self, seconds: float | list[float]):
        costs = iter(seconds) if isinstance(seconds, list) else None

        def serve(keys: np.ndarray) -> dict[str, float]:
            self.served.append((self.t, keys.tolist()))
            cost = next(costs) if costs is not None else seconds
            self.t += cost
            return {"retrieve": cost / 2, "compute": cost / 2}

        return serve


def keys_for(n: int) -> np.ndarray:
    return np.arange(n).reshape(n, 1)


def test_arrival_schedule_is_fixed_by_the_seed_and_long_enough():
    a = poisson_arrivals(50.0, min_requests=200, min_duration_s=3.0, seed=1)
    assert np.array_equal(a, poisson_arrivals(50.0, 200, 3.0, seed=1))
    assert not np.array_equal(a, poisson_arrivals(50.0, 200, 3.0, seed=2))
    assert len(a) >= 200 and a[-1] >= 3.0 and np.all(np.diff(a) > 0)
    long = poisson_arrivals(100.0, min_requests=20_000, min_duration_s=0, seed=0)
    gaps = np.diff(long)
    assert np.mean(gaps) == pytest.approx(0.01, rel=0.05)  # rate 100/s
    assert np.std(gaps) == pytest.approx(0.01, rel=0.05)  # exponential: sd = mean


def test_request_keys_are_drawn_from_the_pool_with_the_seed():
    pool = np.arange(100, 110)
    k = request_keys(pool, 25, 3, seed=4)
    assert k.shape == (25, 3) and np.isin(k, pool).all()
    assert all(len(set(row)) == 3 for row in k.tolist())
    assert np.array_equal(k, request_keys(pool, 25, 3, seed=4))
    first = request_keys(pool, 10, 1, seed=0).ravel()
    assert sorted(first.tolist()) == pool.tolist()  # every key before any repeats


def test_queueing_counts_in_latency_open_loop():
    ft = FakeTime()
    arrivals = np.array([0.0, 0.0, 0.0, 5.0])
    rec = server.run(ft.server(1.0), arrivals, keys_for(4), ft.clock, max_batch=1, max_wait_s=0.0)
    assert rec.latency_s == pytest.approx([1.0, 2.0, 3.0, 1.0])
    assert rec.queue_s == pytest.approx([0.0, 1.0, 2.0, 0.0])
    # the idle server waited for the 4th arrival instead of serving it early
    assert [t for t, _ in ft.served] == pytest.approx([0.0, 1.0, 2.0, 5.0])
    assert rec.duration_s == pytest.approx(6.0)
    m = rec.metrics()
    assert m["latency.achieved_qps"] == pytest.approx(4 / 6.0)
    assert m["latency.request_ms.max"] == pytest.approx(3000.0)
    assert m["latency.step_share.queue"] == pytest.approx(3.0 / 7.0)


def test_arrivals_do_not_wait_for_a_busy_server():
    ft = FakeTime()
    rec = server.run(ft.server(1.0), np.array([0.0, 0.5]), keys_for(2), ft.clock, max_batch=1, max_wait_s=0.0)
    # the second request arrived at 0.5 while the first was served: it waited 0.5 s
    assert rec.latency_s == pytest.approx([1.0, 1.5])
    assert rec.queue_s == pytest.approx([0.0, 0.5])


def test_requests_that_wait_together_run_together():
    ft = FakeTime()
    rec = server.run(
        ft.server(1.0), np.array([0.0, 0.01, 0.02, 3.0]), keys_for(4), ft.clock, max_batch=3, max_wait_s=0.05
    )
    assert [keys for _, keys in ft.served] == [[0, 1, 2], [3]]
    assert ft.served[0][0] == pytest.approx(0.02)  # full before the 50 ms wait ran out
    # the last arrival is served at once: no later request could join its batch
    assert rec.latency_s == pytest.approx([1.02, 1.01, 1.0, 1.0])
    assert rec.batch_requests == [3, 1]


def test_batch_wait_is_bounded_by_max_wait():
    ft = FakeTime()
    rec = server.run(ft.server(1.0), np.array([0.0, 1.0]), keys_for(2), ft.clock, max_batch=2, max_wait_s=0.1)
    assert ft.served[0] == (pytest.approx(0.1), [0])
    assert rec.latency_s == pytest.approx([1.1, 1.1])  # 2nd: queued 1.0 -> 1.1, then served


def test_cold_request_is_separate_and_before_the_schedule():
    ft = FakeTime()
    rec = server.run(
        ft.server([9.0, 1.0, 1.0]),
        np.array([0.0, 2.0]),
        keys_for(2),
        ft.clock,
        max_batch=1,
        max_wait_s=0.0,
        cold_keys=np.array([7]),
    )
    assert rec.first_latency_s == pytest.approx(9.0)
    assert rec.latency_s == pytest.approx([1.0, 1.0])  # the schedule starts after the cold one
    m = rec.metrics()
    assert m["latency.first_request_ms"] == pytest.approx(9000.0)
    assert m["latency.request_ms.max"] == pytest.approx(1000.0)


def test_single_stream_cold_first_then_until_count_and_duration():
    ft = FakeTime()
    keys = iter(keys_for(100))
    rec = single_stream.run(ft.server([2.0] + [0.25] * 99), keys, ft.clock, min_requests=3, min_duration_s=1.0)
    assert rec.first_latency_s == pytest.approx(2.0)
    assert rec.requests == 4  # 3 requests are only 0.75 s: the duration rule asks for a 4th
    assert rec.latency_s == pytest.approx([0.25] * 4)
    assert rec.queue_s == [0.0] * 4
    m = rec.metrics()
    assert m["latency.request_ms.p99"] == pytest.approx(250.0)
    shares = sum(m[f"latency.step_share.{s}"] for s in (*STEPS, "queue", "other"))
    assert shares == pytest.approx(1.0)
    assert m["latency.step_share.retrieve"] == pytest.approx(0.5)


def _server_run(n: int, over: int, bound_ms: float = 50.0, duration_s: float = 2.0) -> LatencyRecord:
    """``n`` server requests, ``over`` of them slower than ``bound_ms`` and the rest well within."""
    lat = [0.2 * bound_ms / 1e3] * (n - over) + [4.0 * bound_ms / 1e3] * over
    return LatencyRecord("server", latency_s=lat, queue_s=[0.0] * n, duration_s=duration_s)


def _bound_reasons(reasons: list[str]) -> list[str]:
    return [r for r in reasons if "latency_bound_ms" in r or "LoadGen" in r]


@pytest.mark.parametrize(("n", "over"), SERVER_CASES)
def test_server_verdict_is_loadgens_server_rule(n, over):
    """INVALID exactly where LoadGen's server case fails: n < min_passing(over) + over
    (scipy.stats.binom, in the test), or LoadGen's p99 sample over the bound."""
    req = Request(min_requests=1, min_duration_s=0.0, latency_bound_ms=50)
    reasons = _bound_reasons(verdict("server", req, _server_run(n, over).metrics()))
    assert (reasons == []) == scipy_server_passes(n, over, 0.99), reasons


def test_validity_rules():
    req = Request(min_requests=10, min_duration_s=1.0, latency_bound_ms=50)
    # 900 requests with 2 over the bound: LoadGen's server rule passes (838 = 836 + 2 needed),
    # though the early-stopping estimate (the 2nd slowest) is over it
    rec = _server_run(900, 2, duration_s=0.5)
    m = rec.metrics()
    assert m["latency.request_ms.p99"] == pytest.approx(10.0)
    assert m["latency.request_ms.p99_early_stopping"] == pytest.approx(200.0)
    reasons = verdict("server", req, m)
    assert reasons == ["latency.duration_seconds 0.50 < run.request.min_duration_s 1.0"]
    # 3 over: 998 + 3 needed
    (reason,) = _bound_reasons(verdict("server", req, _server_run(900, 3).metrics()))
    assert "latency_bound_ms 50" in reason and "2 of 900" in reason and "1001" in reason, reason
    assert verdict("single_stream", req, m) == reasons  # no bound rule in single_stream


def test_too_few_requests_for_the_rules_percentile_is_invalid_naming_the_count():
    req = Request(min_requests=10, min_duration_s=0.0, latency_bound_ms=50)
    # the server's rule needs 459 requests with none over the bound, not the 662 a p99 estimate does
    m = _server_run(661, 0).metrics()
    assert "latency.request_ms.p99_early_stopping" not in m  # no estimate from 661
    assert m["latency.request_ms.p90_early_stopping"] == pytest.approx(10.0)
    assert verdict("server", req, m) == []
    assert verdict("server", req, _server_run(459, 0).metrics()) == []
    (reason,) = verdict("server", req, _server_run(458, 0).metrics())
    assert "458 < 459" in reason and "run.request.min_requests" in reason, reason
    short = LatencyRecord("single_stream", latency_s=[0.01] * 63, queue_s=[0.0] * 63, duration_s=2.0)
    (reason,) = verdict("single_stream", req, short.metrics())
    assert "64" in reason and "p90" in reason
    ok = LatencyRecord("single_stream", latency_s=[0.01] * 64, queue_s=[0.0] * 64, duration_s=2.0)
    assert verdict("single_stream", req, ok.metrics()) == []
    # min_requests stays a floor above the early-stopping count
    assert any("min_requests 1000" in r for r in verdict("server", Request(min_requests=1000), m))


def test_percentiles_are_nearest_rank():
    rec = LatencyRecord("server", latency_s=[0.001 * v for v in range(1, 11)], queue_s=[0.0] * 10, duration_s=1)
    m = rec.metrics()
    # nearest rank: ceil(q/100 * 10)-th smallest, an observed latency (linear would give 5.5, 9.1, 9.91)
    assert m["latency.request_ms.p50"] == pytest.approx(5.0)
    assert m["latency.request_ms.p90"] == pytest.approx(9.0)
    assert m["latency.request_ms.p99"] == pytest.approx(10.0)
    assert rec.cdf_ms()[0] == pytest.approx(1.0) and rec.cdf_ms()[25] == pytest.approx(3.0)


class LateWaker(FakeTime):
    """A generator whose every sleep overshoots by ``late`` seconds (a busy host waking late)."""

    def __init__(self, late: float) -> None:
        super().__init__()
        self.late = late

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds + self.late)


def test_issue_lateness_is_the_late_wake_not_the_queueing():
    ft = LateWaker(0.004)
    arrivals = np.array([0.1, 0.2, 0.25, 1.0])
    rec = server.run(ft.server(0.2), arrivals, keys_for(4), ft.clock, max_batch=1, max_wait_s=0.0)
    # 1st and 4th arrive while the server sleeps: issued 4 ms late; 2nd and 3rd arrive while
    # it serves the 1st: queued on time (their wait is queueing, counted in latency)
    assert rec.lateness_s == pytest.approx([0.004, 0.0, 0.0, 0.004])
    assert rec.latency_s[0] == pytest.approx(0.204)  # from the schedule, lateness included
    m = rec.metrics()
    assert m["latency.issue_lateness_ms.max"] == pytest.approx(4.0)
    assert m["latency.issue_lateness_ms.p50"] == pytest.approx(0.0)


def test_a_generator_that_sends_late_is_invalid():
    arrivals = poisson_arrivals(20.0, min_requests=700, min_duration_s=0.0, seed=3)
    reasons = {}
    for late in (0.0, 0.006):  # 6 ms late against a 100 ms bound: over the 5% (5 ms)
        ft = LateWaker(late)
        rec = server.run(ft.server(0.001), arrivals, keys_for(len(arrivals)), ft.clock, max_batch=1, max_wait_s=0.0)
        reasons[late] = verdict(
            "server", Request(min_requests=10, min_duration_s=0.0, latency_bound_ms=100), rec.metrics()
        )
    assert reasons[0.0] == []
    (reason,) = reasons[0.006]
    assert "latency.issue_lateness_ms.p99 6.00" in reason and "load generator" in reason
