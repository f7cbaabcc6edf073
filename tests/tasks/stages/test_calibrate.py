"""Temperature scaling: the metrics on hand-checked cases, and a deliberately over-confident
model whose held-out NLL and ECE calibration must lower."""

from __future__ import annotations

import pytest
import torch

from tasks.stages import calibrate
from tasks.stages.compute import PredictOutputs


def test_ece_and_brier_by_hand():
    probs = torch.tensor([[0.9, 0.1], [0.6, 0.4]], dtype=torch.float64)
    labels = torch.tensor([0, 1])
    # bin of 0.9: right, gap 0.1; bin of 0.6: wrong, gap 0.6 -> (0.1 + 0.6) / 2
    assert calibrate.ece(probs, labels) == pytest.approx(0.35)
    assert calibrate.brier(torch.tensor([[0.2, 0.7, 0.1]], dtype=torch.float64), torch.tensor([1])) == pytest.approx(
        0.04 + 0.09 + 0.01
    )
    # binary: the usual (p - y)^2 of the positive class
    assert calibrate.brier(probs, labels) == pytest.approx((0.1**2 + 0.6**2) / 2)


def test_regression_and_unit_temperature_are_the_identity():
    x = torch.randn(4, 3)
    assert calibrate.apply(x, 2.0, "regression") is x
    assert calibrate.apply(x, 1.0, "category") is x
    assert torch.equal(calibrate.apply(x, 2.0, "category"), x / 2)
    assert calibrate.fit_temperature(x[:, 0], x[:, 1], "regression") == 1.0
    outs = PredictOutputs({"prediction": x.clone()})
    assert torch.equal(calibrate.calibrate_outputs(outs, 4.0, "category").tensors["prediction"], x / 4)


def _overconfident(kind: str, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.nn.Module]:
    """Rows from a known linear model, scored by that model with its weights x6."""
    g = torch.Generator().manual_seed(seed)
    classes = 4 if kind == "category" else 1
    true = torch.nn.Linear(8, classes)
    with torch.no_grad():
        true.weight.copy_(torch.randn(classes, 8, generator=g) * 0.5)
        true.bias.zero_()
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        logits = true(x)
        if kind == "category":
            y = torch.multinomial(torch.softmax(logits, -1), 1, generator=g).squeeze(-1)
        else:
            y = torch.bernoulli(torch.sigmoid(logits.squeeze(-1)), generator=g)
    over = torch.nn.Linear(8, classes)
    with torch.no_grad():  # deliberately over-confident: the right direction, 6x too sharp
        over.weight.copy_(true.weight * 6)
        over.bias.zero_()
    return x, y, over


@pytest.mark.parametrize("kind", ["category", "binary"])
def test_calibration_lowers_nll_and_ece_of_an_overconfident_model_on_held_out_rows(kind):
    x, y, model = _overconfident(kind, 6000, seed=3)
    with torch.no_grad():
        logits = model(x)
    if kind == "binary":
        logits = logits.squeeze(-1)
    fit_x, fit_y = logits[:3000], y[:3000]  # the validation split: T is fitted here
    held_x, held_y = logits[3000:], y[3000:]  # held-out rows: never seen by the fit
    t = calibrate.fit_temperature(fit_x, fit_y, kind)
    assert t > 3.0  # it found the over-confidence (6x, up to sampling noise)
    q = calibrate.CalibrationQuality(kind, temperature=t)
    q.add(held_x, held_y, torch.ones(len(held_y), dtype=torch.bool))
    m = q.metrics()
    assert m["nll"] < 0.9 * m["uncalibrated.nll"]
    assert m["ece"] < 0.5 * m["uncalibrated.ece"]
    assert m["brier"] < m["uncalibrated.brier"]
    # accuracy is untouched: the argmax / sign does not depend on T
    before = held_x.argmax(-1) if kind == "category" else held_x > 0
    after = (held_x / t).argmax(-1) if kind == "category" else held_x / t > 0
    assert torch.equal(before, after)


def test_quality_counts_only_masked_cells():
    q = calibrate.CalibrationQuality("category", temperature=1.0)
    logits = torch.tensor([[[5.0, 0.0], [0.0, 5.0]]])  # one root row, a branch of 2 cells
    labels = torch.tensor([[0, 0]])
    q.add(logits, labels, torch.tensor([[True, False]]))
    expected = 1 - torch.softmax(torch.tensor([5.0, 0.0], dtype=torch.float64), 0)[0].item()
    assert q.metrics()["ece"] == pytest.approx(expected)
