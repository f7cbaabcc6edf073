"""Noise floor and the minimum detectable effect (MDE) of a comparison.

The between-run coefficient of variation (CV: sample standard deviation over mean) of a
figure, measured by running one configuration N times in fresh processes, says how much two
identical runs differ. From it, the **minimum detectable effect** is the smallest relative
change a two-sided test at ``alpha`` (0.05: 95% confidence) detects with probability
``power`` (0.8) when each side has ``n`` runs:

    MDE = (t[1 - alpha/2, df] + t[power, df]) * sqrt(cv_a**2 / n_a + cv_b**2 / n_b),  df = n_a + n_b - 2

(the two-sample t-test's power formula on relative figures; Student's t, not the normal
quantiles 1.96 + 0.84, because with 6 runs a side the normal version understates the MDE by
10%). With one CV for both sides it is ``(t + t) * cv * sqrt(2 / n)``: 6 runs a side at a CV
of 5% can show a change of 9.0%, no smaller.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

ALPHA = 0.05
POWER = 0.8


def cv(values: Sequence[float]) -> float:
    """Sample standard deviation / mean; NaN below two values or with a zero mean."""
    x = np.asarray(values, dtype=float)
    if x.size < 2 or x.mean() == 0:
        return math.nan
    return float(x.std(ddof=1) / abs(x.mean()))


def mde_two(cv_a: float, n_a: int, cv_b: float, n_b: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Relative MDE of a two-sided test between sides of ``n_a`` and ``n_b`` runs; NaN when
    either side has fewer than two runs or an unknown CV."""
    if n_a < 2 or n_b < 2 or not (math.isfinite(cv_a) and math.isfinite(cv_b)):
        return math.nan
    df = n_a + n_b - 2
    from scipy.stats import t as student_t  # here: scipy.stats takes seconds to import, and CLI checks come first

    factor = float(student_t.ppf(1 - alpha / 2, df) + student_t.ppf(power, df))
    return factor * math.sqrt(cv_a**2 / n_a + cv_b**2 / n_b)


def mde(cv_runs: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Relative MDE for ``n`` runs a side, both sides with the CV ``cv_runs``."""
    return mde_two(cv_runs, n, cv_runs, n, alpha, power)
