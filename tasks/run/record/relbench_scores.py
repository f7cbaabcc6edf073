"""RelBench's own figures for a time-anchored run, and the two baselines the field always shows.

After an offline run over a RelBench task (``source.relbench``), the committed predictions (one
row per root row, keyed by ``seed_key``) are turned into RelBench's prediction table: the test
split's rows in the order ``task.get_table("test", mask_input_cols=True)`` gives them, written by
``relbench.submit.write_prediction_table`` (the task's key columns, then its target column: a
probability for binary, a value for regression) to ``outputs/<name>-<run id>.relbench.csv``, and
scored by ``relbench.submit.evaluate_task``: ``relbench.<metric>`` is exactly what a RelBench user
gets for that file. The same test rows score two baselines through ``task.evaluate``:

- ``train_mean``: the training split's mean label for every row (binary: the positive rate, so
  its roc_auc is 0.5 by definition);
- ``previous``: the label of the row's entity at its latest earlier seed time whose label window
  (seed time + the task's ``timedelta``) had closed by this row's seed time, so it was known then;
  the training mean where there is none. Columnar: one backward as-of join by entity.

Each ``relbench.<metric>`` has a 95% interval (``relbench.<metric>.ci_low|ci_high``): the same
percentile bootstrap as ``quality.<name>.ci_low|ci_high`` (tasks/measure/stats.py
``cluster_bootstrap``, the task's entities resampled with all their seed times) of the metric as
relbench defines it, over the prediction table's own test rows: roc_auc as a weighted AUC (ties
one half), nmae as the weighted MAE over the task's ``nmae_std``.

Multiclass tasks have no RelBench metric (relbench provides none), so nothing is written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import polars as pl

from tasks.measure import keys as K
from tasks.spec.relbench import SEED_KEY, Folder

SCORED_TYPES = ("binary_classification", "regression")  # RelBench evaluates these entity tasks
HIGHER_IS_BETTER = {"roc_auc": True, "nmae": False}


@dataclass(frozen=True)
class RelBenchScores:
    """A run's RelBench figures and its baselines' on the same test rows."""

    metrics: dict[str, float]  # metric -> the run's value
    baselines: dict[str, dict[str, float]] = field(default_factory=dict)  # baseline -> metric -> value
    test_rows: int = 0
    csv: Path | None = None
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)  # metric -> its 95% interval

    def figures(self) -> dict[str, float]:
        out = {K.relbench(m): v for m, v in self.metrics.items()}
        for m, bounds in self.intervals.items():
            out |= {K.relbench_ci(m, b): v for b, v in zip(K.QUALITY_CI_BOUNDS, bounds, strict=True)}
        for b, values in self.baselines.items():
            out |= {K.quality_baseline(b, m): v for m, v in values.items()}
        out[K.RELBENCH_TEST_ROWS] = float(self.test_rows)
        return out


def seed_keys(frame: pl.DataFrame, entity: str, time: str) -> pl.Series:
    """``"<entity>@<YYYY-MM-DDTHH:MM:SS>"`` per row: the root key tasks/sources/relbench.py writes."""
    return frame.select(
        pl.format(
            "{}@{}",
            pl.col(entity).cast(pl.String),
            pl.col(time).cast(pl.Datetime("us")).dt.strftime("%Y-%m-%dT%H:%M:%S"),
        ).alias(SEED_KEY)
    ).to_series()


def _frame(df: pd.DataFrame, columns: list[str]) -> pl.DataFrame:
    return pl.from_pandas(pd.DataFrame(df[columns]))


def score(folder: Folder, predictions: Path, csv: Path) -> RelBenchScores | None:
    """Write the prediction table and score it with relbench (None: a task type it cannot score)."""
    from relbench.load import RelBenchDataset
    from relbench.submit import evaluate_task, write_prediction_table

    tm = folder.task_manifest
    if tm.task_type not in SCORED_TYPES:
        return None
    ent, time, target = str(tm.entity_col), str(tm.time_col), str(tm.target_col)
    ds = RelBenchDataset(folder.path)
    task = ds.load_task(folder.task)
    masked = _frame(task.get_table("test", mask_input_cols=True).df, [ent, time])
    wanted = pl.DataFrame({SEED_KEY: seed_keys(masked, ent, time)})
    preds = pl.read_parquet(predictions, columns=[SEED_KEY, "prediction"])
    joined = wanted.join(preds, on=SEED_KEY, how="left", maintain_order="left")
    missing = joined["prediction"].null_count()
    if missing:
        raise RuntimeError(f"{missing} of {joined.height} test rows of task '{folder.task}' have no prediction")
    tmp = csv.with_name(f".{csv.name}.tmp-{os.getpid()}")
    try:
        write_prediction_table(task, joined["prediction"].cast(pl.Float64).to_numpy(), tmp)
        os.replace(tmp, csv)
    finally:
        tmp.unlink(missing_ok=True)
    metrics = {str(k): float(v) for k, v in evaluate_task(f"{ds.manifest.name}/{folder.task}", csv, dataset=ds).items()}
    truth = task.get_table("test", mask_input_cols=False).df  # the masked table's rows, in its order
    entities = pl.from_pandas(truth[[ent]])[ent].cast(pl.String).to_numpy()  # as the seed keys spell them
    intervals = _intervals(
        task, metrics, truth[target].to_numpy(dtype=np.float64), joined["prediction"].to_numpy(), entities
    )
    return RelBenchScores(metrics, _baselines(task, ent, time, target), joined.height, csv, intervals=intervals)


def _intervals(
    task: Any, metrics: dict[str, float], truth: np.ndarray, pred: np.ndarray, entities: np.ndarray
) -> dict[str, tuple[float, float]]:
    """Each scored metric's bootstrap interval over the test rows, the entities resampled (module
    docstring); a metric without a finite interval (one entity, one class) has none."""
    from tasks.measure.quality import weighted_auc
    from tasks.measure.stats import cluster_bootstrap

    pred = np.asarray(pred, dtype=np.float64)
    out: dict[str, tuple[float, float]] = {}
    for m in metrics:
        if m == "roc_auc":
            statistic = weighted_auc(pred, truth)
        elif m == "nmae":
            error = np.abs(truth - pred) / float(task.nmae_std)

            def statistic(w: np.ndarray, error: np.ndarray = error) -> np.ndarray:
                mae: np.ndarray = (w @ error) / w.sum(axis=1)
                return mae
        else:
            continue
        got = cluster_bootstrap(statistic, entities)
        if got is not None:
            out[m] = got
    return out


def _baselines(task: Any, ent: str, time: str, target: str) -> dict[str, dict[str, float]]:
    tables = {s: task.get_table(s, mask_input_cols=False) for s in ("train", "val", "test")}
    gt = tables["test"]
    mean = float(tables["train"].df[target].astype(float).mean())
    n = len(gt.df)
    known = pl.concat(
        [_frame(t.df, [ent, time, target]) for t in tables.values()], how="vertical_relaxed"
    ).with_columns(pl.col(time).cast(pl.Datetime("us")), pl.col(target).cast(pl.Float64))
    # a label is known once its window has closed: seed time + timedelta
    closed = known.with_columns((pl.col(time) + pd.Timedelta(task.timedelta).to_pytimedelta()).alias("__closed"))
    test = _frame(gt.df, [ent, time]).with_columns(
        pl.col(time).cast(pl.Datetime("us")), pl.int_range(pl.len()).alias("__i")
    )
    prev = (
        test.sort(time)
        .join_asof(
            closed.select(ent, "__closed", pl.col(target).alias("__prev")).sort("__closed"),
            left_on=time,
            right_on="__closed",
            by=ent,
            strategy="backward",
        )
        .sort("__i")
    )
    previous = prev["__prev"].fill_null(mean).to_numpy()
    return {
        "train_mean": {str(k): float(v) for k, v in task.evaluate(np.full(n, mean), target_table=gt).items()},
        "previous": {str(k): float(v) for k, v in task.evaluate(previous, target_table=gt).items()},
    }


def no_better_than_baselines(metrics: dict[str, float]) -> list[str] | None:
    """Reasons a RelBench run did not beat its stronger baseline (None: not a RelBench run)."""
    reasons: list[str] = []
    seen = False
    for m, higher in HIGHER_IS_BETTER.items():
        value = metrics.get(K.relbench(m))
        base = {b: metrics.get(K.quality_baseline(b, m)) for b in K.BASELINES}
        known = {b: v for b, v in base.items() if v is not None}
        if value is None or not known:
            continue
        seen = True
        best_name, best = (max if higher else min)(known.items(), key=lambda kv: kv[1])
        if not np.isfinite(value) or (value <= best if higher else value >= best):
            reasons.append(
                f"{K.relbench(m)} {value:.4f} is no better than the stronger baseline's {best:.4f} "
                f"({K.quality_baseline(best_name, m)}): the model learned nothing usable"
            )
    return reasons if seen else None
