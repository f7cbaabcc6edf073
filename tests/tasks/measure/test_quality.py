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
