"""The headline quality's bootstrap interval (``quality.<headline>.ci_low|ci_high``): known
answers where the sampling distribution is known (a proportion: the normal interval), the
weighted AUC against scikit-learn, and the unit it resamples (a RelBench entity's rows move
together: repeating them under one entity must not narrow the interval, as separate rows it does)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tasks.measure import keys as K
from tasks.measure.quality import Quality, entities_of_seed_keys, weighted_auc
from tasks.measure.stats import cluster_bootstrap

sklearn_metrics = pytest.importorskip("sklearn.metrics")


def accuracy_quality(correct: np.ndarray, keys: np.ndarray | None = None) -> Quality:
    """A category Quality whose rows are right where ``correct`` (two classes, label 0)."""
    n = len(correct)
    logits = torch.zeros(n, 2)
    logits[:, 1] = torch.from_numpy(np.where(correct, -1.0, 1.0))  # class 0 wins where right
    q = Quality("category")
    q.add(logits, torch.zeros(n, dtype=torch.long), torch.ones(n, dtype=torch.bool), keys)
    return q


def width(interval: dict[str, float], name: str) -> float:
    return interval[f"{name}.ci_high"] - interval[f"{name}.ci_low"]


def test_a_proportions_interval_is_the_normal_one():
    # 300 of 400 right: p = 0.75, se = sqrt(p (1 - p) / n) = 0.021651, so 95%: 0.7076 .. 0.7924
    correct = np.arange(400) % 4 != 0
    q = accuracy_quality(correct, np.arange(400))
    got = q.interval()
    assert set(got) == {"accuracy.ci_low", "accuracy.ci_high"}
    se = math.sqrt(0.75 * 0.25 / 400)
    assert got["accuracy.ci_low"] == pytest.approx(0.75 - 1.96 * se, abs=0.006)
    assert got["accuracy.ci_high"] == pytest.approx(0.75 + 1.96 * se, abs=0.006)
    assert got["accuracy.ci_low"] < q.metrics()["accuracy"] < got["accuracy.ci_high"]
    assert q.interval() == got  # seeded: the same interval every time


def test_the_interval_narrows_as_one_over_the_square_root_of_the_rows():
    small = accuracy_quality(np.arange(400) % 4 != 0, np.arange(400)).interval()
    large = accuracy_quality(np.arange(6400) % 4 != 0, np.arange(6400)).interval()  # 16x the rows
    assert width(large, "accuracy") / width(small, "accuracy") == pytest.approx(0.25, abs=0.03)


def test_an_entitys_rows_move_together():
    """400 entities, each at 8 seed times with the same outcome: resampling entities gives the
    interval of 400 draws; treating the 3,200 rows as independent would give one 1/sqrt(8) as wide."""
    entity_right = np.arange(400) % 4 != 0
    keys = np.array([f"{e}@1997-0{t + 1}-01T00:00:00" for e in range(400) for t in range(8)])
    correct = np.repeat(entity_right, 8)
    alone = accuracy_quality(entity_right, np.arange(400)).interval()
    by_entity = accuracy_quality(correct, keys).interval(by_entity=True)
    by_row = accuracy_quality(correct, keys).interval(by_entity=False)
    assert width(by_entity, "accuracy") == pytest.approx(width(alone, "accuracy"), rel=0.1)
    assert width(by_row, "accuracy") / width(alone, "accuracy") == pytest.approx(1 / math.sqrt(8), rel=0.15)


def test_seed_keys_name_their_entity():
    keys = np.array(["12@1997-06-01T00:00:00", "a@b@1998-01-01T00:00:00", "7@1992-01-01T00:00:00"])
    assert entities_of_seed_keys(keys).tolist() == ["12", "a@b", "7"]


def test_weighted_auc_is_scikit_learns_with_unit_and_integer_weights():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 15, 300).astype(float)  # many ties
    labels = (rng.random(300) < 0.4).astype(float)
    auc = weighted_auc(scores, labels)
    assert auc(np.ones((1, 300)))[0] == pytest.approx(sklearn_metrics.roc_auc_score(labels, scores))
    counts = rng.integers(0, 4, 300)  # a resample: row i drawn counts[i] times
    want = sklearn_metrics.roc_auc_score(np.repeat(labels, counts), np.repeat(scores, counts))
    assert auc(counts[None].astype(float))[0] == pytest.approx(want)


def test_binary_interval_holds_the_auc_and_is_empty_with_one_class():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1000, generator=g)
    labels = (torch.rand(1000, generator=g) < torch.sigmoid(2 * logits)).float()
    q = Quality("binary")
    q.add(logits, labels, torch.ones(1000, dtype=torch.bool), np.arange(1000))
    got, auc = q.interval(), q.metrics()["auc"]
    assert got[K.quality_ci_name("auc", "ci_low")] < auc < got[K.quality_ci_name("auc", "ci_high")]
    assert 0.02 < width(got, "auc") < 0.1
    one = Quality("binary")
    one.add(torch.tensor([0.1, 0.5, 0.9]), torch.ones(3), torch.ones(3, dtype=torch.bool), np.arange(3))
    assert one.interval() == {}  # AUC undefined: no interval claimed


def test_regression_interval_is_in_the_targets_units():
    errors = np.tile([0.0, 1.0, 2.0, 3.0], 100)  # |error| in standardised units, mean 1.5
    q = Quality("regression", target_std=10.0)
    q.add(torch.from_numpy(errors), torch.zeros(400, dtype=torch.float64), torch.ones(400, dtype=torch.bool), None)
    got = q.interval()
    assert q.metrics()["mae"] == pytest.approx(15.0)
    se = 10.0 * np.std(errors) / math.sqrt(400)  # 0.559
    assert got["mae.ci_low"] == pytest.approx(15.0 - 1.96 * se, abs=0.1)
    assert got["mae.ci_high"] == pytest.approx(15.0 + 1.96 * se, abs=0.1)


def test_a_branch_targets_cells_belong_to_their_root_row():
    q = Quality("regression")
    pred = torch.tensor([[1.0, 2.0, 9.0], [3.0, 4.0, 5.0]])
    mask = torch.tensor([[True, True, False], [False, True, True]])
    q.add(pred, torch.zeros(2, 3), mask, np.array(["a@t", "b@t"]))
    assert q._keys[0] is not None and q._keys[0].tolist() == ["a@t", "a@t", "b@t", "b@t"]
    assert set(q.interval(by_entity=True)) == {"mae.ci_low", "mae.ci_high"}


def test_no_interval_from_fewer_than_two_units():
    assert accuracy_quality(np.array([True, False, True]), np.array(["e@1", "e@2", "e@3"])).interval(True) == {}
    assert cluster_bootstrap(lambda w: w.sum(axis=1), np.zeros(5)) is None
    assert Quality("binary").interval() == {}
