"""Statistics over repeat samples: median and a bootstrap 95% confidence interval."""

from __future__ import annotations

import numpy as np


def median_ci(samples: list[float], level: float = 0.95, resamples: int = 2000,
              seed: int = 0) -> tuple[float, float, float]:
    """(median, ci_low, ci_high) of the median, by percentile bootstrap.

    With one sample the interval collapses to it: there is no spread to estimate.
    """
    x = np.asarray(samples, dtype=float)
    med = float(np.median(x))
    if x.size < 2:
        return med, med, med
    rng = np.random.default_rng(seed)
    boot = np.median(rng.choice(x, size=(resamples, x.size), replace=True), axis=1)
    lo, hi = np.quantile(boot, [(1 - level) / 2, 1 - (1 - level) / 2])
    return med, float(min(lo, med)), float(max(hi, med))
