"""RelBench's own figures and the two baselines (tasks/run/record/relbench_scores.py), on a folder the
test writes, scored by relbench's real classes and checked against sums done by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pytest
from sklearn.metrics import mean_absolute_error, roc_auc_score

from tasks.measure import keys as K
from tasks.run.record.relbench_scores import no_better_than_baselines, score, seed_keys
from tasks.spec.relbench import SEED_KEY, open_folder
from tests.tasks.relbench_folders import social


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return social(tmp_path_factory.mktemp("rb") / "social")


def rows(folder: Path, task: str) -> pd.DataFrame:
    parts = [
        pd.read_parquet(folder / "tasks" / task / f"{s}.parquet").assign(split=s) for s in ("train", "val", "test")
    ]
    return pd.concat(parts, ignore_index=True)


def predictions(folder: Path, task: str, out: Path, values: np.ndarray | None = None) -> pd.DataFrame:
    """A predictions file like the write stage's: one row per (entity, seed time), every split."""
    df = rows(folder, task)
    keys = seed_keys(pl.from_pandas(df[["user_id", "timestamp"]]), "user_id", "timestamp")
    df["prediction"] = np.random.default_rng(1).uniform(0, 1, len(df)) if values is None else values
    pl.DataFrame({SEED_KEY: keys, "prediction": df["prediction"].to_numpy()}).write_parquet(out)
    return df


def previous_by_hand(df: pd.DataFrame, target: str, window: pd.Timedelta, fallback: float) -> list[float]:
    test = df[df.split == "test"]
    out = []
    for _, r in test.iterrows():
        known = df[(df.user_id == r.user_id) & (df.timestamp + window <= r.timestamp)]
        out.append(float(known.sort_values("timestamp")[target].iloc[-1]) if len(known) else fallback)
    return out


def test_binary_figures_are_relbenchs_own_and_the_baselines_match_by_hand(folder, tmp_path):
    df = predictions(folder, "user-posts", tmp_path / "p.parquet")
    csv = tmp_path / "p.relbench.csv"
    got = score(open_folder(folder, "user-posts"), tmp_path / "p.parquet", csv)
    assert got is not None and got.csv == csv
    test = df[df.split == "test"]
    assert got.test_rows == len(test)
    written = pd.read_csv(csv)
    assert list(written.columns) == ["user_id", "timestamp", "posts_next"]  # keys, then the prediction
    assert got.metrics["roc_auc"] == pytest.approx(roc_auc_score(test.posts_next, test.prediction))
    assert got.baselines["train_mean"]["roc_auc"] == pytest.approx(0.5)  # one value for every row
    mean = float(df[df.split == "train"].posts_next.mean())
    prev = previous_by_hand(df, "posts_next", pd.Timedelta("30 days"), mean)
    assert got.baselines["previous"]["roc_auc"] == pytest.approx(roc_auc_score(test.posts_next, prev))
    figures = got.figures()
    assert figures[K.relbench("roc_auc")] == got.metrics["roc_auc"]
    assert figures[K.quality_baseline("previous", "roc_auc")] == got.baselines["previous"]["roc_auc"]


def test_regression_nmae_is_mae_over_the_training_targets_spread(folder, tmp_path):
    df = predictions(folder, "user-score", tmp_path / "p.parquet")
    got = score(open_folder(folder, "user-score"), tmp_path / "p.parquet", tmp_path / "p.relbench.csv")
    assert got is not None
    test, train = df[df.split == "test"], df[df.split == "train"]
    std = float(train.score_next.std(ddof=1))
    assert got.metrics["nmae"] == pytest.approx(mean_absolute_error(test.score_next, test.prediction) / std)
    mean = float(train.score_next.mean())
    assert got.baselines["train_mean"]["nmae"] == pytest.approx(
        mean_absolute_error(test.score_next, np.full(len(test), mean)) / std
    )


def test_a_model_must_beat_the_stronger_baseline():
    m = {K.relbench("roc_auc"): 0.70, K.quality_baseline("train_mean", "roc_auc"): 0.5}
    assert no_better_than_baselines(m) == []
    m[K.quality_baseline("previous", "roc_auc")] = 0.72  # the entity's past is stronger
    (reason,) = no_better_than_baselines(m) or [""]
    assert "quality.baseline.previous.roc_auc" in reason
    n = {
        K.relbench("nmae"): 0.9,
        K.quality_baseline("train_mean", "nmae"): 1.0,
        K.quality_baseline("previous", "nmae"): 0.8,
    }
    assert no_better_than_baselines(n)  # lower is better for nmae
    assert no_better_than_baselines({K.quality("auc"): 0.9}) is None  # not a RelBench run


@pytest.mark.parametrize(("task", "metric"), [("user-posts", "roc_auc"), ("user-score", "nmae")])
def test_each_relbench_figure_has_the_quality_intervals_bootstrap_over_its_test_entities(
    folder, tmp_path, task, metric
):
    """``relbench.<metric>.ci_low|ci_high``: the interval ``quality.<name>.ci_low|ci_high`` would
    give the same test rows (tasks/measure/quality.py, entities resampled with all their seed
    times), the metric as relbench defines it: the AUC itself, the MAE over the training std."""
    import torch

    from tasks.measure.quality import Quality

    target = {"user-posts": "posts_next", "user-score": "score_next"}[task]
    df = predictions(folder, task, tmp_path / "p.parquet")
    got = score(open_folder(folder, task), tmp_path / "p.parquet", tmp_path / "p.relbench.csv")
    assert got is not None
    low, high = got.intervals[metric]
    assert low < got.metrics[metric] < high
    figures = got.figures()
    assert (figures[K.relbench_ci(metric, "ci_low")], figures[K.relbench_ci(metric, "ci_high")]) == (low, high)
    test, train = df[df.split == "test"], df[df.split == "train"]
    keys = seed_keys(pl.from_pandas(test[["user_id", "timestamp"]]), "user_id", "timestamp").to_numpy()
    kind = "binary" if metric == "roc_auc" else "regression"
    q = Quality(kind, target_std=1.0)
    pred = torch.tensor(test.prediction.to_numpy(), dtype=torch.float64)
    q.add(pred, torch.tensor(test[target].to_numpy(dtype=np.float64)), torch.ones(len(test), dtype=torch.bool), keys)
    ci = q.interval(by_entity=True)
    scale = 1.0 if metric == "roc_auc" else float(train[target].std(ddof=1))  # nmae = mae / std
    headline = "auc" if metric == "roc_auc" else "mae"
    expected = (ci[f"{headline}.ci_low"] / scale, ci[f"{headline}.ci_high"] / scale)
    assert (low, high) == pytest.approx(expected, rel=1e-6)
