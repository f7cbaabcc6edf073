"""The peak-rate search brackets a known knee: stub servers whose latency rises with rate,
one a queueing model driven through the real server scenario on a fake clock."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.run.scenarios import server
from tasks.run.scenarios.latency import LatencyRecord
from tasks.run.scenarios.peak import Probe, check_args, search
from tasks.run.scenarios.schedule import poisson_arrivals
from tasks.runtime.errors import UserError
from tests.tasks.run.scenarios.test_latency import FakeTime, keys_for


def stub(p99_of_rate):
    calls: list[float] = []

    def probe(rate: float) -> Probe:
        calls.append(rate)
        p99 = p99_of_rate(rate)
        return Probe(rate, p99, p99 is not None and p99 <= 50.0)

    return probe, calls


@pytest.mark.parametrize("start", [1.0, 10.0, 37.0, 500.0])
def test_search_brackets_a_step_knee_within_5_percent(start):
    knee = 37.3
    probe, calls = stub(lambda r: 10.0 if r <= knee else 400.0)
    res = search(probe, bound_ms=50.0, start_qps=start)
    assert res.low is not None and res.high is not None
    assert res.low <= knee < res.high and res.high / res.low <= 1.05
    assert len(calls) == len(res.probes) <= 16


def test_search_brackets_a_smooth_rise():
    # p99 = 10 / (1 - rate / 100) ms: 50 ms at rate 80, the knee
    probe, _ = stub(lambda r: 10.0 / (1 - r / 100) if r < 100 else 1e6)
    res = search(probe, bound_ms=50.0, start_qps=10.0)
    assert res.low is not None and res.high is not None
    assert res.low < 80.0 <= res.high and res.high / res.low <= 1.05  # 80 itself: 50 ms + rounding
    # the peak is a probed, passing rate; nothing above the bracket's top passed
    assert any(p.rate == res.low and p.passed for p in res.probes)


@pytest.mark.parametrize("seed", range(8))
def test_a_rate_that_passes_above_a_failure_is_never_the_peak(seed):
    # noise near the knee: between 30 and 60 a probe passes or fails by chance
    rng = np.random.default_rng(seed)
    probe, _ = stub(lambda r: 10.0 if r <= 30 or (r < 60 and rng.random() < 0.5) else 400.0)
    res = search(probe, bound_ms=50.0, start_qps=7.0)
    assert res.low is not None and res.high is not None and res.low < res.high
    failed = [p.rate for p in res.probes if not p.passed]
    assert res.high == min(failed)  # the lowest failure caps the result
    assert res.low == max(p.rate for p in res.probes if p.passed and p.rate < res.high)
    assert res.high >= 30 and res.low < 60


def test_no_passing_rate_leaves_no_peak():
    # the p99 falls with the rate (load sets it) but never reaches the bound
    probe, _ = stub(lambda r: 100.0 + 300.0 * r)
    res = search(probe, bound_ms=50.0, start_qps=1.0, min_qps=0.1)
    assert res.low is None and res.high is not None and res.high <= 0.2
    assert not res.unloaded_above_bound


def test_halving_stops_when_the_rate_no_longer_sets_the_latency():
    """A server whose p99 is 290 ms whatever the rate (its unloaded latency) against a 100 ms
    bound: the search stops after one halving (10 then 5 QPS) instead of halving to min_qps,
    each probe twice as long as the last (it ran 10, 5, 2.5, 1.25 QPS for over 10 minutes)."""
    calls: list[float] = []

    def probe(rate: float) -> Probe:  # keeps up with every rate (achieved = target)
        calls.append(rate)
        return Probe(rate, 290.0 - rate * 0.4, False, achieved_qps=rate)

    res = search(probe, bound_ms=50.0, start_qps=10.0)
    assert calls == [10.0, 5.0]
    assert res.unloaded_above_bound and res.low is None and res.high == 5.0

    # the same p99s from a server that falls behind up to 3 QPS (achieved 3 of 10 and of 5):
    # saturated there, so halving goes on, and stops once two probes that kept up (2.5, 1.25)
    # agree
    calls.clear()
    res = search(
        lambda r: (calls.append(r), Probe(r, 290.0, False, achieved_qps=min(r, 3.0)))[1],
        bound_ms=50.0,
        start_qps=10.0,
        min_qps=1.0,
    )
    assert calls == [10.0, 5.0, 2.5, 1.25] and res.unloaded_above_bound


BUSY = ("host.other_cpu_fraction 0.70 > run.max_host_load 0.5",)


def test_probes_invalid_for_another_reason_are_not_latency_above_the_bound():
    """Failed before: two probes INVALID for host load (or output mismatches), their p99s 30 ms
    against a 100 ms bound, kept up and agreed within 10%, so the search stopped saying the
    latency at low load was above the bound, and the lower one was the bracket's upper end.
    Neither missed the bound: halving stops (a lower rate cures neither cause), and says so."""
    calls: list[float] = []

    def probe(rate: float) -> Probe:
        calls.append(rate)
        return Probe(rate, 30.0, False, achieved_qps=rate, validity="INVALID", reasons=BUSY)

    res = search(probe, bound_ms=100.0, start_qps=10.0)
    assert calls == [10.0, 5.0]
    assert not res.unloaded_above_bound and res.failed_otherwise
    assert res.high is None and res.low is None and not res.bracketed
    assert res.ceiling == 5.0


def _busy_at_40(knee: float):
    """A server that holds a 50 ms bound up to ``knee`` QPS, whose probe at 40 QPS ran on a busy
    host: INVALID, its p99 (12 ms) within the bound."""

    def probe(rate: float) -> Probe:
        if rate == 40.0:
            return Probe(rate, 12.0, False, achieved_qps=rate, validity="INVALID", reasons=BUSY)
        p99 = 10.0 if rate <= knee else 400.0
        return Probe(rate, p99, p99 <= 50.0, achieved_qps=rate)

    return probe


def test_a_probe_invalid_for_another_reason_caps_the_search_but_is_no_upper_bound():
    # Failed before: the busy probe at 40 QPS was the bracket's upper end, and the search
    # claimed a peak below it, though no probe's latency showed one.
    res = search(_busy_at_40(knee=100.0), bound_ms=50.0, start_qps=10.0)
    assert res.ceiling == 40.0 and res.low is not None and 40.0 / res.low <= 1.05  # never at or above 40
    assert res.high is None and not res.bracketed  # no probe missed the bound: no peak claimed
    assert not res.unloaded_above_bound and not res.failed_otherwise
    # with the knee below the busy rate, the upper end is the rate that missed the bound
    res = search(_busy_at_40(knee=30.0), bound_ms=50.0, start_qps=10.0)
    assert res.bracketed and res.low is not None and res.high is not None
    assert res.low <= 30.0 < res.high < 40.0 and res.high / res.low <= 1.05


def test_search_brackets_the_capacity_of_a_queueing_server():
    """A server taking 20 ms a request (capacity 50/s), run through server.run with a fake
    clock: the early-stopping p99 stays under 200 ms up to a rate short of 50 and then rises;
    the search's bracket holds the rate where the p99 crosses the bound."""

    def p99_at(rate: float) -> float | None:
        ft = FakeTime()
        arrivals = poisson_arrivals(rate, min_requests=700, min_duration_s=0.0, seed=1)
        rec: LatencyRecord = server.run(
            ft.server(0.02), arrivals, keys_for(len(arrivals)), ft.clock, max_batch=1, max_wait_s=0.0
        )
        return rec.early_stopping_ms(99)

    def probe(rate: float) -> Probe:
        p99 = p99_at(rate)
        return Probe(rate, p99, p99 is not None and p99 <= 200.0)

    res = search(probe, bound_ms=200.0, start_qps=5.0)
    assert res.low is not None and res.high is not None and res.high / res.low <= 1.05
    assert 20.0 < res.low < 50.0  # under capacity, well above an idle server's rate
    assert p99_at(res.low) <= 200.0 < p99_at(res.high)
    assert p99_at(10.0) < p99_at(res.low)  # latency rises with rate: a knee, not noise
    assert np.isfinite(res.low)


def test_probe_requests_are_checked_against_loadgens_server_rule():
    """A probe passes by LoadGen's server rule: 459 requests with none over the bound pass
    (min_passing(0) = 459 at p99, confidence 0.99; worked in test_early_stopping.py), so 459 is
    the fewest a probe may ask for. The old check asked for a p99 estimate's 662."""
    check_args(50.0, 459, 0.0, 0.05)  # accepted
    with pytest.raises(UserError, match=r"--probe-requests is 458; .* fewer than 459 requests,.*\(662 tolerates one"):
        check_args(50.0, 458, 0.0, 0.05)
