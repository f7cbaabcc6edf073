"""Statistics over repeat samples: the median and a distribution-free interval for it, and
the one percentile definition every timing percentile uses.

Percentiles are **nearest rank** (LoadGen's definition): the ``q``-th percentile of ``n``
values is the value at rank ``ceil(q/100 * n)`` of the sorted values, always a measured
value, never an interpolation between two (numpy's ``inverted_cdf``). Batch times
(``compute.batch_ms.p50|p95|p99``) read ``nearest_rank``; request latencies
(tasks/run/scenarios/latency.py ``nearest_rank_ms``) use the same definition, and
tests/tasks/measure/test_records.py holds the two equal.

The interval is the order-statistic (sign-test) interval ``[x_(k), x_(n-k+1)]``: for any
continuous distribution it covers the true median with probability exactly
``1 - 2 * P(Binomial(n, 1/2) <= k - 1)``, whatever the shape of the timing noise. ``k`` is
the largest index whose coverage still reaches the requested level, so the interval is
conservative and its exact level is reported with it. Below ``MIN_CI_SAMPLES`` (6 for 95%)
no order statistics reach the level: there is no 95% interval, and none is claimed. (A
percentile bootstrap of the median with 2-3 samples is just [min, max] and covers the true
median about 75% of the time; it is not used.)

Quality figures are another matter: one run scores hundreds or thousands of held-out rows, so
``cluster_bootstrap`` gives a quality figure a percentile bootstrap interval over them
(``quality.<name>.ci_low|ci_high``, tasks/measure/quality.py), resampling whole units (a
RelBench entity's rows at every seed time) rather than single rows.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

CI_LEVEL = 0.95
CI_METHOD = "order-statistic interval for the median (distribution-free)"


def order_statistic_coverage(n: int, k: int) -> float:
    """Exact coverage of ``[x_(k), x_(n-k+1)]`` (1-based) for the median of a continuous law."""
    if k < 1 or 2 * k > n + 1:
        return 0.0
    tail: float = sum(math.comb(n, i) for i in range(k)) / 2**n
    return 1.0 - 2.0 * tail


def order_statistic_k(n: int, level: float = CI_LEVEL) -> int | None:
    """Largest ``k`` whose interval reaches ``level``; ``None`` when even [min, max] does not."""
    best = None
    for k in range(1, (n + 1) // 2 + 1):
        if order_statistic_coverage(n, k) >= level:
            best = k
        else:
            break
    return best


def min_samples(level: float = CI_LEVEL) -> int:
    """Smallest n with an order-statistic interval at ``level`` (6 for 95%)."""
    n = 1
    while order_statistic_k(n, level) is None:
        n += 1
    return n


MIN_CI_SAMPLES = min_samples(CI_LEVEL)


def nearest_rank(values: Sequence[float] | np.ndarray, q: float) -> float:
    """Nearest-rank percentile ``q`` (0..100) of ``values``: the value at rank
    ``ceil(q/100 * n)`` of the sorted values (rank 1 for ``q = 0``)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("nearest_rank needs at least one value")
    return float(np.percentile(x, q, method="inverted_cdf"))


@dataclass(frozen=True)
class MedianInterval:
    median: float
    n: int
    low: float | None = None  # None: too few samples for an interval at the level
    high: float | None = None
    level: float | None = None  # exact coverage of [low, high] (>= the requested level)

    @property
    def has_interval(self) -> bool:
        return self.low is not None


def median_interval(samples: list[float] | np.ndarray, level: float = CI_LEVEL) -> MedianInterval:
    """The median and, when ``len(samples) >= MIN_CI_SAMPLES``, its order-statistic interval."""
    x = np.sort(np.asarray(samples, dtype=float))
    if x.size == 0:
        raise ValueError("median_interval needs at least one sample")
    med = float(np.median(x))
    k = order_statistic_k(int(x.size), level)
    if k is None:
        return MedianInterval(med, int(x.size))
    return MedianInterval(
        med, int(x.size), float(x[k - 1]), float(x[x.size - k]), order_statistic_coverage(int(x.size), k)
    )


# The bootstrap interval of a quality figure (tasks/measure/quality.py ``Quality.interval``):
# resamples drawn, and the seed, fixed so that a run's interval is reproducible.
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
# Weights held per vectorised call: resamples x rows at most this many (memory, not accuracy).
_BOOTSTRAP_CELLS = 4_000_000


def cluster_bootstrap(
    statistic: Callable[[np.ndarray], np.ndarray],
    units: np.ndarray,
    level: float = CI_LEVEL,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float] | None:
    """A percentile bootstrap interval of a figure over rows that come in units (an entity's
    rows move together): each resample draws as many units as there are, with replacement
    (``scipy.stats.bootstrap`` over the unit ids), and the figure is ``statistic(weights)`` with
    each row weighted by how often its unit was drawn (``weights``: [resamples, rows] -> one value
    per resample). ``units``: one label per row. None with fewer than two units, or when a
    bound is not finite (e.g. an AUC whose resamples lack a class)."""
    from scipy.stats import DegenerateDataWarning, bootstrap  # seconds to import: only where needed

    labels, codes = np.unique(np.asarray(units), return_inverse=True)
    n_units, n_rows = len(labels), len(codes)
    if n_units < 2:
        return None

    def weighted(sample: np.ndarray, axis: int = -1) -> np.ndarray:
        drawn = np.moveaxis(np.asarray(sample), axis, -1)
        flat = drawn.reshape(-1, n_units)
        offsets = (np.arange(flat.shape[0]) * n_units)[:, None]
        counts = np.bincount((flat + offsets).ravel(), minlength=flat.shape[0] * n_units)
        rows = counts.reshape(flat.shape[0], n_units)[:, codes].astype(np.float64)
        return np.asarray(statistic(rows)).reshape(drawn.shape[:-1])

    # NaN resamples (an AUC's without a class) make NaN bounds, refused below: not warned about
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateDataWarning)
        res = bootstrap(
            (np.arange(n_units),),
            weighted,
            n_resamples=resamples,
            batch=max(1, _BOOTSTRAP_CELLS // max(n_rows, n_units)),
            vectorized=True,
            axis=-1,
            confidence_level=level,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return (low, high) if np.isfinite(low) and np.isfinite(high) else None
