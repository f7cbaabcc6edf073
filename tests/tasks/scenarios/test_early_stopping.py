"""LoadGen's early-stopping criterion against values computed independently with
scipy.stats.binom (the binomial CDF LoadGen evaluates through an incomplete beta function),
and the counts LoadGen prints: 64 queries for p90, 130 for p95, 662 for p99."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from scipy.stats import binom

from tasks.scenarios import early_stopping as es


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
