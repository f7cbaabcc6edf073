"""Significance across independent runs: the rank test, Holm over its family, and the
minimum detectable effect (MDE) of exactly that test.

``relflow-bench compare`` judges a metric by the two-sided Mann-Whitney U test over one
sample per independent run (``run_sample``), Holm-corrected over every metric it tests (the
family); ``relflow-bench noise`` publishes the MDE a comparison of two such groups would have.
Both use the functions here, so the power a report promises is the power of the test that
decides.

- ``rank_test_p``: scipy's ``mannwhitneyu``, two-sided. Without ties, the exact null
  distribution of U. With ties, scipy's "exact" ignores them, and its normal approximation
  can fall below the smallest p an exact test can give (4 tied runs at 1 against 4 at 2:
  0.013 against 2/70 = 0.029), so ties are tested by the exact permutation distribution
  while there are at most ``EXACT_PERMUTATIONS`` arrangements, and only beyond that by the
  tie-corrected normal approximation.
- ``min_rank_p``: the smallest two-sided p at sizes ``n_a``, ``n_b``: ``2 / C(n_a + n_b, n_a)``
  (every run of one side beyond every run of the other).
- ``reachable``: Holm's first step compares the smallest p with ``alpha / m`` (``m`` metrics
  in the family); a metric can only be marked when its sizes can reach that, i.e. ``m *
  min_rank_p < alpha``. 4 vs 4 (2/70) reaches 0.05 for one metric only, 5 vs 5 (2/252) for up
  to 6, 6 vs 6 (2/924) for up to 23. Elsewhere no outcome of the runs could be marked.
- ``rank_mde``: the smallest relative shift the rank test detects with probability
  ``power`` (0.8) at Holm's first step (``alpha / m``), under a normal model of each side
  with its between-run CV: baseline runs ``1 + cv_a * z``, candidate runs ``1 + d + cv_b * z``.
  The test rejects upwards when U (candidate-over-baseline pairs) reaches the critical value
  ``u`` that scipy's own p-values give at these sizes; U reaches ``u`` exactly when the shift
  ``d`` exceeds the ``u``-th smallest of the pairwise differences ``baseline_i - candidate_j``
  of the unshifted draws, so the MDE is the ``power`` quantile of that order statistic over
  ``MDE_DRAWS`` draws from a fixed seed (no bisection; the same figure every call). The lower
  tail's rejections under an upward shift (below ``alpha / 2m``) are not counted, so the MDE
  is conservative by at most that much power. ``inf`` where the sizes cannot reach the
  level, NaN where a CV is unknown. A Student-t formula (what this replaced) promised 2.37 CVs
  at 4 vs 4 where the rank test needs 2.88, and a finite MDE where it cannot reject at all.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence

import numpy as np

from tasks.measure import keys as K

ALPHA = 0.05
POWER = 0.8
MDE_DRAWS = 20_000  # Monte Carlo draws of the MDE: its 80% quantile to about 1% (relative)
MDE_SEED = 20240535  # fixed: one figure per (CVs, sizes, level), not a new one each call
EXACT_PERMUTATIONS = 5_000  # ties: exact permutation p up to this many arrangements (7 vs 7 = 3,432)
_MDE_CHUNK = 2_000_000  # pairwise differences held at once


def run_sample(metrics: Mapping[str, float], key: str) -> float | None:
    """A run's one sample of ``key``: the median over its predict passes 1..N-1 when logged
    (``run.repeats >= 3``; pass 0 holds the first call, never a sample of the steady state),
    else the run's plain figure. compare's samples and noise's CV both read this."""
    if K.median(key) in metrics and metrics.get(K.REPEATS_MEASURED, 1) >= 2:
        return metrics[K.median(key)]
    return metrics.get(key)


def rank_test_p(baseline: Sequence[float], candidate: Sequence[float]) -> float:
    """Two-sided Mann-Whitney U p-value (scipy), exact wherever the sizes allow."""
    from scipy import stats  # here: scipy.stats takes seconds to import, and CLI checks come first

    x, y = np.asarray(baseline, dtype=float), np.asarray(candidate, dtype=float)
    pooled = np.concatenate([x, y])
    if np.unique(pooled).size == 1:
        return 1.0  # every arrangement gives the same U: nothing to test
    if np.unique(pooled).size == pooled.size:
        return float(stats.mannwhitneyu(x, y, alternative="two-sided", method="exact").pvalue)
    if math.comb(x.size + y.size, x.size) <= EXACT_PERMUTATIONS:
        exact = stats.PermutationMethod(n_resamples=np.inf)  # every arrangement: exact with ties
        return float(stats.mannwhitneyu(x, y, alternative="two-sided", method=exact).pvalue)
    return float(stats.mannwhitneyu(x, y, alternative="two-sided", method="asymptotic").pvalue)


def min_rank_p(n_a: int, n_b: int) -> float:
    """Smallest two-sided p the rank test can give at these sizes."""
    if n_a == 0 or n_b == 0:
        return 1.0
    return min(1.0, 2 / math.comb(n_a + n_b, n_a))


def reachable(n_a: int, n_b: int, family: int = 1, alpha: float = ALPHA) -> bool:
    """Whether any outcome of ``n_a`` vs ``n_b`` runs could be marked with ``family`` metrics
    tested: Holm's first step needs ``family * p < alpha`` for the smallest p."""
    return n_a >= 2 and n_b >= 2 and family * min_rank_p(n_a, n_b) < alpha


def runs_needed(family: int = 1, alpha: float = ALPHA) -> int:
    """Fewest runs a side (equal sides) at which ``family`` tested metrics can be marked."""
    n = 2
    while not reachable(n, n, family, alpha):
        n += 1
    return n


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, in the input order (monotone, capped at 1)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


@functools.cache
def critical_u(n_a: int, n_b: int, level: float) -> int | None:
    """Smallest U (candidate-over-baseline pairs) whose two-sided p is below ``level``, by
    scipy's exact p at every possible U; None when no U is."""
    from scipy import stats

    # Baseline 0..n_a-1 and candidate values on an irrational step: all n_a * n_b differences
    # are distinct, so shifting the candidate across them walks U through every value 0..n_a*n_b.
    base = np.arange(n_a, dtype=float)
    cand = np.arange(n_b, dtype=float) * (math.pi / 10)
    diffs = np.sort((base[:, None] - cand[None, :]).ravel())
    shifts = np.concatenate([[diffs[0] - 1.0], (diffs[:-1] + diffs[1:]) / 2, [diffs[-1] + 1.0]])
    p = stats.mannwhitneyu(cand[None, :] + shifts[:, None], base[None, :], axis=1, method="exact").pvalue
    upper = [u for u in range(n_a * n_b + 1) if 2 * u >= n_a * n_b and p[u] < level]
    return upper[0] if upper else None


@functools.lru_cache(maxsize=512)
def _mde(cv_a: float, n_a: int, cv_b: float, n_b: int, level: float, power: float) -> float:
    crit = critical_u(n_a, n_b, level)
    if crit is None:
        return math.inf
    rng = np.random.default_rng(MDE_SEED)
    per_chunk = max(1, _MDE_CHUNK // (n_a * n_b))
    thresholds = []
    for start in range(0, MDE_DRAWS, per_chunk):
        draws = min(per_chunk, MDE_DRAWS - start)
        base = cv_a * rng.standard_normal((draws, n_a))
        cand = cv_b * rng.standard_normal((draws, n_b))
        diffs = (base[:, :, None] - cand[:, None, :]).reshape(draws, -1)
        # U(d) = #{differences < d} >= crit exactly when d exceeds the crit-th smallest difference
        thresholds.append(np.partition(diffs, crit - 1, axis=1)[:, crit - 1])
    return float(np.quantile(np.concatenate(thresholds), power, method="inverted_cdf"))


def rank_mde(
    cv_a: float,
    n_a: int,
    cv_b: float,
    n_b: int,
    *,
    family: int = 1,
    alpha: float = ALPHA,
    power: float = POWER,
) -> float:
    """Relative MDE of the rank test between ``n_a`` and ``n_b`` runs with between-run CVs
    ``cv_a`` and ``cv_b``, at Holm's first step over ``family`` metrics: ``inf`` when these
    sizes cannot reach ``alpha / family``, NaN with fewer than 2 runs a side or an unknown CV."""
    if n_a < 2 or n_b < 2 or not (math.isfinite(cv_a) and math.isfinite(cv_b)):
        return math.nan
    if not reachable(n_a, n_b, family, alpha):
        return math.inf
    return _mde(abs(cv_a), n_a, abs(cv_b), n_b, alpha / family, power)


__all__ = [
    "ALPHA",
    "POWER",
    "critical_u",
    "holm",
    "min_rank_p",
    "rank_mde",
    "rank_test_p",
    "reachable",
    "run_sample",
    "runs_needed",
]
