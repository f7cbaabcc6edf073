"""Scenario timing rules with a fake clock: the schedule is fixed by the seed, queueing counts
in latency, requests waiting together are served together, the cold request stays apart."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.measure.clock import Clock
from tasks.scenarios import server, single_stream
from tasks.scenarios.latency import STEPS, LatencyRecord, verdict
from tasks.scenarios.schedule import poisson_arrivals, request_keys
from tasks.spec import Request


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


def test_validity_rules():
    req = Request(min_requests=10, min_duration_s=1.0, latency_bound_ms=50)
    rec = LatencyRecord("server", latency_s=[0.01] * 9 + [0.2], queue_s=[0.0] * 10, duration_s=0.5)
    reasons = verdict("server", req, rec.metrics())
    assert any("min_duration_s" in r for r in reasons)
    assert any("latency_bound_ms" in r for r in reasons)
    assert not any("min_requests" in r for r in reasons)
    ok = LatencyRecord("server", latency_s=[0.01] * 10, queue_s=[0.0] * 10, duration_s=2.0)
    assert verdict("server", req, ok.metrics()) == []
    assert verdict("single_stream", req, rec.metrics()) == [r for r in reasons if "bound" not in r]
