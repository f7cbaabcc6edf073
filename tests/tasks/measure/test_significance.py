"""The rank test compare runs, Holm, and the MDE of that test: each checked against values
computed another way (by hand, by numerical integration, by simulating scipy's own test)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import integrate, optimize, stats

from tasks.measure import keys as K
from tasks.measure import significance
from tasks.measure.significance import (
    critical_u,
    holm,
    min_rank_p,
    rank_mde,
    rank_test_p,
    reachable,
    run_sample,
    runs_needed,
)


def test_rank_test_p_by_hand():
    # 4 vs 4 without ties: 70 equally likely arrangements. Complete separation is 1 of them
    # each way (p = 2/70); one swapped pair adds one more arrangement each way (p = 4/70).
    assert rank_test_p([1, 2, 3, 4], [5, 6, 7, 8]) == pytest.approx(2 / 70)
    assert rank_test_p([1, 2, 3, 5], [4, 6, 7, 8]) == pytest.approx(4 / 70)
    assert rank_test_p([3.0, 3.0, 3.0], [3.0, 3.0]) == 1.0


def test_tied_runs_get_the_exact_permutation_p_not_the_normal_approximation():
    # Four runs tied at 1 against four tied at 2: still 1 arrangement in 70 each way, p = 2/70.
    # scipy's default (normal approximation once there are ties) says 0.013, below the smallest
    # p four runs a side can give: at 2 metrics, Holm would have marked it (0.026 < 0.05).
    assert stats.mannwhitneyu([1] * 4, [2] * 4).pvalue < 0.014
    assert rank_test_p([1] * 4, [2] * 4) == pytest.approx(2 / 70)
    # (1,1,1,2) vs (2,3,3,3): the normal approximation gives 0.032; every split of the pooled
    # values, counted below, gives 4/70
    assert stats.mannwhitneyu([1, 1, 1, 2], [2, 3, 3, 3]).pvalue < 0.033
    assert _enumerated_p([1, 1, 1, 2], [2, 3, 3, 3]) == pytest.approx(4 / 70)
    assert rank_test_p([1, 1, 1, 2], [2, 3, 3, 3]) == pytest.approx(4 / 70)


def _enumerated_p(x: list[float], y: list[float]) -> float:
    """Two-sided p of U over every split of the pooled values (ties count one half)."""

    def u(a: list[float], b: list[float]) -> float:
        return sum((ai > bj) + 0.5 * (ai == bj) for ai in a for bj in b)

    pooled, n, centre = [*x, *y], len(x), len(x) * len(y) / 2
    observed = abs(u(x, y) - centre)
    splits = list(itertools.combinations(range(len(pooled)), n))
    extreme = 0
    for idx in splits:
        a = [pooled[i] for i in idx]
        b = [pooled[i] for i in range(len(pooled)) if i not in idx]
        extreme += abs(u(a, b) - centre) >= observed - 1e-12
    return extreme / len(splits)


def test_smallest_p_and_which_sizes_can_reach_holms_first_step():
    assert min_rank_p(4, 4) == pytest.approx(2 / 70)
    assert min_rank_p(5, 5) == pytest.approx(2 / 252)
    assert min_rank_p(6, 6) == pytest.approx(2 / 924)
    # the smallest p scipy gives (complete separation) is that figure
    assert stats.mannwhitneyu([1, 2, 3, 4, 5], [6, 7, 8, 9, 10], method="exact").pvalue == pytest.approx(2 / 252)
    assert reachable(4, 4, 1) and not reachable(4, 4, 2)  # 2 * 2/70 = 0.057
    assert reachable(5, 5, 6) and not reachable(5, 5, 7)  # 6 * 2/252 = 0.048, 7 * 2/252 = 0.056
    assert reachable(6, 6, 23) and not reachable(6, 6, 24)  # 23 * 2/924 = 0.0498
    assert not reachable(3, 3, 1) and not reachable(2, 6, 1) and not reachable(1, 50, 1)
    assert reachable(2, 9, 1)  # 2 / C(11, 2) = 2/55 = 0.036: unequal sizes count too
    assert (runs_needed(1), runs_needed(2), runs_needed(7), runs_needed(10)) == (4, 5, 6, 6)


def test_critical_u_by_hand():
    # 4 vs 4 at 0.05: only U = 16 (p = 2/70) is below; U = 15 has p = 4/70
    assert critical_u(4, 4, 0.05) == 16
    assert critical_u(4, 4, 0.025) is None
    # 6 vs 6 at 0.05: published tables give the critical U 5 (P(U <= 5) = 0.0206, doubled 0.041;
    # P(U <= 6) = 0.0325, doubled 0.065), i.e. 36 - 5 = 31 candidate-over-baseline pairs
    assert critical_u(6, 6, 0.05) == 31


def test_holm_by_hand():
    # sorted: 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> kept monotone at 0.06
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def _max_of_4_sum_quantile(power: float) -> float:
    """The ``power`` quantile of M1 + M2, M the largest of 4 standard normals."""

    def cdf(t: float) -> float:
        density = lambda m: 4 * stats.norm.pdf(m) * stats.norm.cdf(m) ** 3 * stats.norm.cdf(t - m) ** 4  # noqa: E731
        return integrate.quad(density, -np.inf, np.inf)[0]

    return optimize.brentq(lambda t: cdf(t) - power, 0.0, 10.0)


def test_mde_at_4_vs_4_is_the_shift_that_separates_the_groups_80_percent_of_the_time():
    # At 4 vs 4 the test rejects only on complete separation: min(candidate) + d > max(baseline).
    # With both sides N(0, cv^2) before the shift, max(baseline) - min(candidate) is cv * (M1 + M2),
    # M the largest of 4 standard normals: the MDE is cv times its 80% quantile, 2.8807
    # (numerical integration). The t formula this replaced said 2.3707.
    expected = _max_of_4_sum_quantile(0.8)
    assert expected == pytest.approx(2.8807, abs=1e-3)
    assert rank_mde(0.05, 4, 0.05, 4) == pytest.approx(0.05 * expected, rel=0.01)


def _power(d: float, cv_a: float, n_a: int, cv_b: float, n_b: int, level: float, seed: int) -> float:
    """Rejection rate of scipy's exact two-sided rank test under a shift ``d``, simulated."""
    rng = np.random.default_rng(seed)
    base = 1 + cv_a * rng.standard_normal((4000, n_a))
    cand = 1 + d + cv_b * rng.standard_normal((4000, n_b))
    p = stats.mannwhitneyu(base, cand, axis=1, method="exact").pvalue
    return float((p < level).mean())


def test_mde_is_where_scipys_own_test_reaches_80_percent_power():
    # 6 vs 7 runs, unequal CVs, Holm over 3 metrics (first step 0.05/3): simulate the real test
    # at the MDE (another seed, 4,000 draws: +-0.02 at 2 standard errors) and below it.
    mde = rank_mde(0.03, 6, 0.06, 7, family=3)
    assert _power(mde, 0.03, 6, 0.06, 7, 0.05 / 3, seed=1) == pytest.approx(0.8, abs=0.025)
    assert _power(0.75 * mde, 0.03, 6, 0.06, 7, 0.05 / 3, seed=2) < 0.65
    # a larger family asks for a smaller p: a larger MDE
    assert rank_mde(0.03, 6, 0.06, 7, family=10) > mde


def test_mde_is_inf_where_no_outcome_could_be_marked_and_nan_without_a_spread():
    assert rank_mde(0.05, 4, 0.05, 4, family=2) == math.inf
    assert rank_mde(0.05, 3, 0.05, 3) == math.inf  # noise --runs 3: the test cannot reject
    assert rank_mde(0.05, 2, 0.05, 2) == math.inf
    assert rank_mde(0.05, 5, 0.05, 5, family=7) == math.inf
    assert math.isfinite(rank_mde(0.05, 5, 0.05, 5, family=6))
    assert math.isnan(rank_mde(0.05, 1, 0.05, 6))
    assert math.isnan(rank_mde(math.nan, 6, 0.05, 6))


def test_mde_is_reproducible_and_proportional_to_the_cv():
    # The simulation is cached (significance._mde): a second call would only read the first
    # call's figure back. Clear the cache, so each figure is a fresh simulation; only the fixed
    # seed makes them agree (a new seed moves the figure by about 1%).
    significance._mde.cache_clear()
    a = rank_mde(0.05, 6, 0.05, 6)
    significance._mde.cache_clear()
    assert rank_mde(0.05, 6, 0.05, 6) == a  # a fixed seed: one figure, every call
    assert significance._mde.cache_info().misses == 1  # computed again, not read from the cache
    significance._mde.cache_clear()
    assert rank_mde(0.10, 6, 0.10, 6) == pytest.approx(2 * a, rel=1e-9)  # the test is scale-free


def test_a_runs_sample_is_its_repeat_median_from_pass_1_when_logged():
    key = K.E2E_PREDICT_ROWS_PER_S
    with_repeats = {key: 50.0, K.median(key): 100.0, K.REPEATS_MEASURED: 3.0}
    assert run_sample(with_repeats, key) == 100.0
    # one measured pass after the first: no median was logged, the plain figure is the sample
    assert run_sample({key: 50.0, K.REPEATS_MEASURED: 1.0}, key) == 50.0
    assert run_sample({}, key) is None
