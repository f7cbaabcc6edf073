"""The noise floor: the coefficient of variation (CV: sample standard deviation over mean).

Between runs, measured by running one configuration N times in fresh processes
(``relflow-bench noise``), it says how much two identical runs differ; within one run, over its
steady window's batch times (``compute.steady_batch_ms.cv``), how steady the window was. What a
between-run CV lets a comparison detect is the minimum detectable effect of the rank test
compare runs, ``tasks.measure.significance.rank_mde``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def cv(values: Sequence[float]) -> float:
    """Sample standard deviation / mean; NaN below two values or with a zero mean."""
    x = np.asarray(values, dtype=float)
    if x.size < 2 or x.mean() == 0:
        return math.nan
    return float(x.std(ddof=1) / abs(x.mean()))
