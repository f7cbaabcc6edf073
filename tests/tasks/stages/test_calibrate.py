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
    # one definition for every kind: the squared error summed over both classes of a 2-column
    # row too, (0.1^2 + 0.1^2) and (0.6^2 + 0.6^2), i.e. twice the one-class (p - y)^2
    assert calibrate.brier(probs, labels) == pytest.approx((2 * 0.1**2 + 2 * 0.6**2) / 2)


def test_ece_with_a_confidence_of_exactly_one_and_brier_against_scikit_learn():
    # torchmetrics' bins are [k/15, (k+1)/15), and a confidence of exactly 1 has a bin of its
    # own: rows (1.0, right), (0.9, right), (0.6, wrong) fall in three bins with gaps 0, 0.1
    # and 0.6 -> (0 + 0.1 + 0.6) / 3
    probs = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.6, 0.4]], dtype=torch.float64)
    labels = torch.tensor([0, 0, 1])
    assert calibrate.ece(probs, labels) == pytest.approx(0.7 / 3, rel=1e-6)
    brier_score_loss = pytest.importorskip("sklearn.metrics").brier_score_loss
    three = torch.tensor([[0.2, 0.7, 0.1], [0.5, 0.25, 0.25]], dtype=torch.float64)
    assert calibrate.brier(three, torch.tensor([1, 2])) == pytest.approx(
        brier_score_loss([1, 2], three.numpy(), labels=[0, 1, 2])
    )
    # scikit-learn halves a 2-column (binary) Brier score; ours counts both classes
    assert calibrate.brier(probs, labels) == pytest.approx(2 * brier_score_loss([0, 0, 1], probs[:, 1].numpy()))


def test_brier_of_a_binary_target_equals_the_same_2_class_category_target():
    logit = torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64)
    labels = torch.tensor([1.0, 1.0, 0.0])
    binary = calibrate.scores(logit, labels, "binary", 1.0)["brier"]
    # the same probabilities as 2-class softmax logits (0, z): sigmoid(z) = softmax([0, z])[1]
    category = calibrate.scores(
        torch.stack([torch.zeros(3, dtype=torch.float64), logit], -1), labels.long(), "category", 1.0
    )
    assert binary == pytest.approx(category["brier"])
    p = torch.sigmoid(logit)
    assert binary == pytest.approx(float((2 * (p - labels.double()) ** 2).mean()))


def test_calibration_fits_and_reports_on_disjoint_held_out_rows(shop_spec, shop_tables, write_tables, prepare_chunk):
    """The temperature is fitted on one half of the held-out rows and quality.nll|ece|brier
    scored on the other: together exactly the held-out labelled cells, never overlapping."""
    import pyarrow as pa

    from tasks.libraries.reference.engine import Engine

    n = 200  # the shop's customers, widened so both halves of the held-out rows are populated
    shop_tables["customers"] = pa.table(
        {
            "c_id": pa.array(range(1, n + 1), pa.int64()),
            "c_balance": pa.array([float(i % 17) for i in range(n)]),
            "c_segment": pa.array(["a", "b", "c", "a"] * (n // 4)),
            "c_since": shop_tables["customers"]["c_since"].take([i % 5 for i in range(n)]),
            "churn": pa.array(["yes", "no", "no", "yes", "no"] * (n // 5)),
        }
    )
    spec, enc, schema, tz = prepare_chunk(shop_spec, write_tables(shop_tables))
    engine = Engine(spec, schema, torch.device("cpu"), encoding=enc)
    assert tz.batch is not None
    held = tz.batch.label_present.bool() & ~tz.is_train
    fit_x, _ = calibrate.validation_logits(engine, tz)
    assert 0 < fit_x.shape[0] < int(held.sum())  # the fit saw only part of the held-out cells
    from tasks.stages.split import calibration_fit_rows

    report = calibrate.report_mask(tz.is_fit, held)
    assert fit_x.shape[0] + int(report.sum()) == int(held.sum())
    fit_rows = torch.from_numpy(calibration_fit_rows(tz.keys))
    assert not (report & fit_rows).any()  # no report cell is a fit row
    assert fit_x.shape[0] == int((held & fit_rows).sum())
    q = calibrate.CalibrationQuality(spec.task.kind)
    q.add(torch.randn(len(held), 3), tz.batch.labels, report)
    assert q.rows == int(report.sum())
    q.begin_pass()  # the next predict pass starts empty: repeats do not add rows
    assert q.rows == 0


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
    # torchmetrics bins in float32: the ECE to 1e-5, far below its sampling noise
    assert q.metrics()["ece"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("kind", ["category", "binary"])
def test_a_fit_with_no_wrong_top_class_keeps_t_1_and_never_inflates_held_out_mistakes(kind):
    """The default workload at batch 128: every fit row right, the fit went to T = 0.0159 (no
    finite minimiser: sharpening lowers a separable set's NLL all the way to 0), and the report
    half's one mistake took its NLL from 0.0097 to 0.234. Such a fit keeps T = 1; one wrong
    fit row makes the minimiser finite again, and it is fitted."""
    g = torch.Generator().manual_seed(0)
    n = 400
    if kind == "category":
        y = torch.randint(0, 3, (n,), generator=g)
        x = torch.rand(n, 3, generator=g)  # in [0, 1)
        x[torch.arange(n), y] += 2.0  # every top class right, by 1-3
        wrong_x = torch.tensor([[4.0, 0.0, 0.0]])  # a held-out mistake: label 1
        wrong_y = torch.tensor([1])
    else:
        y = (torch.rand(n, generator=g) > 0.5).float()
        x = (y * 2 - 1) * (2.0 + torch.rand(n, generator=g))  # every side right
        wrong_x, wrong_y = torch.tensor([3.0]), torch.tensor([0.0])
    assert calibrate.fit_errors(x, y, kind) == 0
    assert calibrate.fit_temperature(x, y, kind) == 1.0
    held_x, held_y = torch.cat([x, wrong_x]), torch.cat([y, wrong_y])
    # what the unguarded fit's T (0.0159 on the real run) does to the held-out rows
    assert calibrate.nll(held_x, held_y, kind, 0.0159) > 2 * calibrate.nll(held_x, held_y, kind, 1.0)
    # one wrong fit row: a finite T, fitted (not the kept 1.0)
    x1, y1 = torch.cat([x, wrong_x]), torch.cat([y, wrong_y])
    assert calibrate.fit_errors(x1, y1, kind) == 1
    assert calibrate.fit_temperature(x1, y1, kind) != 1.0
