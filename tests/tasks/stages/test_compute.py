"""The quality compute accumulates over held-out rows (tasks/measure/quality.py, used by every engine)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks.measure.quality import Quality

# --- quality -----------------------------------------------------------------------------


def test_category_accuracy_on_held_out_rows():
    q = Quality("category")
    logits = torch.tensor([[3.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    labels = torch.tensor([0, 1, 1, 2])
    q.add(logits, labels, torch.tensor([True, True, True, False]))  # last row not counted
    q.add(torch.tensor([[0.0, 5.0, 0.0]]), torch.tensor([1]), torch.tensor([True]))
    m = q.metrics()
    assert m["rows"] == 4
    assert m["accuracy"] == pytest.approx(3 / 4)
    assert m["majority_rate"] == pytest.approx(3 / 4)  # label 1 three times of four
    assert q.headline == "accuracy"


def test_binary_auc_against_a_hand_count():
    # positives score 0.35, 0.8; negatives 0.1, 0.4: 3 of 4 pairs ordered -> AUC 0.75
    logits = torch.logit(torch.tensor([0.1, 0.4, 0.35, 0.8]))
    labels = torch.tensor([0.0, 0.0, 1.0, 1.0])
    q = Quality("binary")
    q.add(logits, labels, torch.ones(4, dtype=torch.bool))
    m = q.metrics()
    assert m["auc"] == pytest.approx(0.75)
    assert m["accuracy"] == pytest.approx(3 / 4)  # 0.4 -> positive: wrong
    assert q.headline == "auc"
    # ties count one half
    q = Quality("binary")
    q.add(torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0.0, 1.0, 1.0]), torch.ones(3, dtype=torch.bool))
    assert q.metrics()["auc"] == pytest.approx((0.5 + 1.0) / 2)
    # one class only: undefined
    q = Quality("binary")
    q.add(torch.tensor([0.3]), torch.tensor([1.0]), torch.ones(1, dtype=torch.bool))
    assert np.isnan(q.metrics()["auc"])


def test_regression_errors_in_original_units():
    q = Quality("regression", target_mean=10.0, target_std=2.0)
    q.add(torch.tensor([0.0, 1.0, -1.0]), torch.tensor([0.5, 1.0, 0.0]), torch.ones(3, dtype=torch.bool))
    m = q.metrics()
    assert m["mae"] == pytest.approx((1.0 + 0.0 + 2.0) / 3)
    assert m["rmse"] == pytest.approx(np.sqrt((1.0 + 0.0 + 4.0) / 3))
    assert Quality("regression").metrics() == {}


def test_branch_target_quality_counts_present_rows_only():
    q = Quality("category")
    logits = torch.zeros(2, 2, 3)
    logits[..., 1] = 1.0  # predicts class 1 everywhere
    labels = torch.tensor([[1, 0], [2, 0]])
    mask = torch.tensor([[True, False], [True, False]])
    q.add(logits, labels, mask)
    assert q.metrics()["accuracy"] == pytest.approx(0.5)
