"""Quality figures against another library's: ROC AUC against scikit-learn (installed with
MLflow), including logits far beyond where a float32 sigmoid saturates."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tasks.measure.quality import Quality

sklearn_metrics = pytest.importorskip("sklearn.metrics")


def _auc(logits: torch.Tensor, labels: torch.Tensor) -> float:
    q = Quality("binary")
    q.add(logits, labels, torch.ones(len(labels), dtype=torch.bool))
    return q.metrics()["auc"]


def test_auc_matches_scikit_learn_with_ties():
    g = torch.Generator().manual_seed(0)
    logits = torch.round(torch.randn(500, generator=g) * 2) / 2  # many ties
    labels = (torch.rand(500, generator=g) < torch.sigmoid(logits)).float()
    assert _auc(logits, labels) == pytest.approx(sklearn_metrics.roc_auc_score(labels.numpy(), logits.numpy()))


def test_auc_of_saturated_logits_keeps_their_order():
    # float32 sigmoid(20) == sigmoid(45) == 1.0: a library that squashes logits first would see
    # five ties (AUC 0.5); the order says 7 of 8 pairs are right
    logits = torch.tensor([20.0, 25.0, 30.0, 35.0, 40.0, 45.0])
    labels = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    assert _auc(logits, labels) == pytest.approx(sklearn_metrics.roc_auc_score(labels.numpy(), logits.numpy()))
    assert _auc(logits, labels) == pytest.approx(7 / 8)


def test_auc_of_one_class_is_undefined():
    assert math.isnan(_auc(torch.tensor([0.3, 0.9]), torch.tensor([1.0, 1.0])))
    assert math.isnan(_auc(torch.tensor([0.3, 0.9]), torch.tensor([0.0, 0.0])))
    assert np.isfinite(_auc(torch.tensor([0.3, 0.9]), torch.tensor([0.0, 1.0])))


def test_a_held_out_class_the_model_never_learned_counts_as_wrong_everywhere():
    """``UNSEEN_CLASS`` labels of held-out rows (``scored``) are scored, as misses: in accuracy,
    in the rows, in the interval's resamples; the majority rate is the commonest learned class's
    share of all of them. A held-out row without a label, or a training row, is not scored."""
    from model.batch import UNSEEN_CLASS

    u = UNSEEN_CLASS
    labels = torch.tensor([0, 0, 0, 1, 1, u, u, u, u, u, 0])
    present = labels >= 0
    present[10] = False  # a held-out row whose label is null
    scored = torch.ones(11, dtype=torch.bool)
    scored[9] = False  # a training row of a class the fit never saw: not scored
    logits = torch.nn.functional.one_hot(labels.clamp(min=0), 3).float()  # every learned class right
    q = Quality("category")
    q.add(logits, labels, present & scored, scored=scored)
    m = q.metrics()
    assert m["rows"] == 9 and m["unseen_class_rows"] == 4
    assert m["accuracy"] == pytest.approx(5 / 9)
    assert m["majority_rate"] == pytest.approx(3 / 9)
    ci = q.interval()
    assert ci["accuracy.ci_low"] < 5 / 9 < ci["accuracy.ci_high"] < 1.0  # the misses are in every resample
    # a model that learned no class at all (relflow before any training batch): every row a miss
    none = Quality("category")
    none.add(
        torch.zeros(3, 0), torch.full((3,), u), torch.zeros(3, dtype=torch.bool), scored=torch.ones(3, dtype=torch.bool)
    )
    assert none.metrics() == {"rows": 3.0, "accuracy": 0.0, "majority_rate": 0.0, "unseen_class_rows": 3.0}
