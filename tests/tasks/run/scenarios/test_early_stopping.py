"""LoadGen's early-stopping criterion against values computed independently with
scipy.stats.binom (the binomial CDF LoadGen evaluates through an incomplete beta function),
against values LoadGen's own compiled code returned, and the counts LoadGen prints: 64
queries for p90, 130 for p95, 662 for p99; the server's count rule (459 with none over the
bound, 838 with two) included."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from scipy.stats import binom

from tasks.run.scenarios import early_stopping as es


@cache
def scipy_min_passing(t: int, p: float, c: float = 0.99) -> int:
    """Smallest h with P[Binomial(h + t, 1 - p) <= t] < 1 - c, by a scan over every h."""
    h = np.arange(0, 200 * (t + 1) + 2000)
    passing = np.nonzero(binom.cdf(t, h + t, 1 - p) < 1 - c)[0]
    assert len(passing), "scan range too short"
    return int(h[passing[0]])


def scipy_estimate(lat: np.ndarray, p: float) -> float | None:
    """LoadGen's loop as written in results.cc: t grows until n < min_passing(t) + t."""
    n = len(lat)
    if n < scipy_min_passing(1, p) + 1:
        return None
    t = 1
    for i in range(2, n + 1):
        if n < scipy_min_passing(i, p) + i:
            t = i - 1
            break
    return float(np.sort(lat)[n - t])


@pytest.mark.parametrize(("p", "needed"), [(0.90, 64), (0.95, 130), (0.99, 662)])
def test_fewest_requests_match_loadgen(p, needed):
    assert es.min_requests(p) == needed
    assert es.min_requests(p) == scipy_min_passing(1, p) + 1


@pytest.mark.parametrize("p", [0.9, 0.95, 0.99])
@pytest.mark.parametrize("t", [0, 1, 2, 5, 17])
def test_min_passing_against_scipy(p, t):
    assert es.min_passing(t, p) == scipy_min_passing(t, p)


@pytest.mark.parametrize(("h", "t", "p"), [(600, 3, 0.99), (44, 0, 0.9), (1000, 40, 0.95), (5, 5, 0.5)])
def test_odds_is_the_binomial_cdf(h, t, p):
    assert es.odds(h, t, p) == pytest.approx(binom.cdf(t, h + t, 1 - p), rel=1e-9)


@pytest.mark.parametrize("n", [63, 64, 65, 100, 250, 661, 662, 700, 1500])
def test_estimate_against_loadgens_loop(n):
    lat = np.random.default_rng(n).lognormal(0.0, 0.5, n)
    for p in (0.9, 0.99):
        assert es.estimate(lat, p) == scipy_estimate(lat, p)


def test_estimate_is_the_max_at_the_minimum_and_never_below_the_raw_percentile():
    lat = np.random.default_rng(0).exponential(1.0, 5000)
    assert es.estimate(lat[:64], 0.9) == lat[:64].max()  # 64 requests: no overshoot allowed
    assert es.estimate(lat[:63], 0.9) is None
    raw = float(np.percentile(lat, 99, method="inverted_cdf"))
    est = es.estimate(lat, 0.99)
    assert est is not None and est > raw  # conservative for the count run
    # the slowest ones discarded: fewer than the raw 1% tail
    assert int((lat > est).sum()) < int((lat > raw).sum())


# What LoadGen's own code returns, from compiling loadgen/early_stopping.cc of mlcommons/inference
# (commit b66003e10e2db4b8c36a448b0545ec90fcc6e9e9) with a driver that calls its
# MinPassingQueriesFinder as PerformanceSummary::EarlyStopping (results.cc) does: a fresh finder
# for the server's one call, one finder through the single-stream loop. Independent of scipy and
# of this module: its own incomplete-beta series and its own interpolated binary search.
LOADGEN_SERVER_MIN_PASSING = {  # p99: overshoots t -> min_passing(t)
    0: 459,
    1: 661,
    2: 836,
    3: 998,
    4: 1153,
    5: 1302,
    6: 1447,
    7: 1589,
}
LOADGEN_SINGLE_STREAM_T = {  # (p, n) -> t, the estimate being the t-th slowest (0: no estimate)
    (0.9, 63): 0,
    (0.9, 64): 1,
    (0.9, 100): 3,
    (0.9, 900): 69,
    (0.9, 1000): 78,
    (0.9, 20000): 1901,
    (0.99, 661): 0,
    (0.99, 662): 1,
    (0.99, 837): 1,
    (0.99, 838): 2,
    (0.99, 1000): 2,
    (0.99, 1001): 3,
    (0.99, 5000): 33,
    (0.99, 20000): 167,
}


@pytest.mark.parametrize(("t", "h"), LOADGEN_SERVER_MIN_PASSING.items())
def test_min_passing_is_loadgens_own(t, h):
    assert es.min_passing(t, 0.99) == h == scipy_min_passing(t, 0.99)


@pytest.mark.parametrize(("pn", "t"), LOADGEN_SINGLE_STREAM_T.items())
def test_single_stream_estimate_rank_is_loadgens_own(pn, t):
    p, n = pn
    assert es.overshoots_allowed(n, p) == t


def scipy_server_passes(n: int, over: int, p: float) -> bool:
    """LoadGen's Server case of EarlyStopping plus its percentile constraint (results.cc):
    n >= min_passing(over) + over, and the sample at index int(n * p) of the sorted latencies
    within the bound (at most n - 1 - int(n * p) of them over it)."""
    return n >= scipy_min_passing(over, p) + over and over <= n - 1 - int(n * p)


# Around each step of LoadGen's server rule at p99: 459 requests with none over the bound
# (the estimate needs 662), 661 + 1, 836 + 2, 998 + 3; 900 requests with 2 over pass LoadGen.
SERVER_CASES = [
    (458, 0),
    (459, 0),
    (500, 0),
    (661, 1),
    (662, 1),
    (837, 2),
    (838, 2),
    (900, 2),
    (900, 3),
    (1000, 3),
    (1001, 3),
    (1500, 5),
    (1500, 6),
]


@pytest.mark.parametrize(("n", "over"), SERVER_CASES)
def test_server_rule_is_loadgens_count_rule(n, over):
    assert es.server_passes(n, over, 0.99) == scipy_server_passes(n, over, 0.99)


@pytest.mark.parametrize("n", [1, 458, 459, 500, 661, 662, 838, 900, 1001, 5000])
def test_overshoots_tolerated_is_the_most_the_server_rule_passes(n):
    k = 0  # the passing counts are a prefix: min_passing(k) + k grows with k
    while scipy_server_passes(n, k, 0.99):
        k += 1
    assert es.overshoots_tolerated(n, 0.99) == (k - 1 if k else None)


@pytest.mark.parametrize("seed", range(6))
def test_server_bound_is_the_lowest_bound_the_server_rule_passes(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(459, 3000))
    lat = rng.lognormal(0.0, 0.7, n)
    bound = es.server_bound(lat, 0.99)
    assert bound is not None and bound in lat  # an observed latency
    assert scipy_server_passes(n, int((lat > bound).sum()), 0.99)
    below = np.nextafter(bound, -np.inf)
    assert not scipy_server_passes(n, int((lat > below).sum()), 0.99)
    # one rank above the estimate's (the estimate discards t - 1, the rule tolerates t)
    est = es.estimate(lat, 0.99)
    if est is not None:
        assert bound < est
    assert es.server_bound(lat[:458], 0.99) is None  # fewer than min_passing(0): nothing passes
