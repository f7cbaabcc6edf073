"""Validity rule: a trained model must beat the trivial predictor on held-out rows.

Non-finite inputs once made a model predict one class for every row: accuracy fell below
the majority-class rate and the run was VALID. A run whose quality is no better than the
majority-class rate (category, binary: ``quality.accuracy <= quality.majority_rate``) or
than predicting the mean (regression: ``quality.mae >= quality.mae_of_mean``) is INVALID
with that reason. Applied only where quality is meaningful (trained weights).

A NaN on either side (non-finite predictions, or nothing scored) cannot beat anything, but
every comparison with NaN is false, so it once passed: a NaN is INVALID with its own reason.
"""

from __future__ import annotations

import math

from tasks.measure import keys as K
from tasks.run.record.relbench_scores import no_better_than_baselines


def _nan_reasons(metrics: dict[str, float], names: tuple[str, ...]) -> list[str]:
    return [
        f"{K.quality(n)} is NaN (non-finite predictions or no held-out rows scored), so the "
        "model cannot be shown to beat the trivial predictor"
        for n in names
        if (v := metrics.get(K.quality(n))) is not None and math.isnan(v)
    ]


def no_better_than_baseline(metrics: dict[str, float]) -> list[str]:
    """The reason the model did not beat the trivial predictor, or nothing. A RelBench task is held
    to the stronger of its two baselines on its own metrics (tasks/run/record/relbench_scores.py)."""
    relbench = no_better_than_baselines(metrics)
    if relbench is not None:
        return relbench
    nan = _nan_reasons(metrics, ("accuracy", "majority_rate", "auc", "mae", "mae_of_mean"))
    if nan:
        return nan
    acc, rate = metrics.get(K.quality("accuracy")), metrics.get(K.quality("majority_rate"))
    if acc is not None and rate is not None and acc <= rate:
        return [
            f"quality.accuracy {acc:.4f} is no better than the majority-class rate "
            f"{rate:.4f} (quality.majority_rate): the model learned nothing usable"
        ]
    mae, mean_mae = metrics.get(K.quality("mae")), metrics.get(K.quality("mae_of_mean"))
    if mae is not None and mean_mae is not None and mae >= mean_mae:
        return [
            f"quality.mae {mae:.4f} is no better than predicting the mean "
            f"({mean_mae:.4f}, quality.mae_of_mean): the model learned nothing usable"
        ]
    return []
