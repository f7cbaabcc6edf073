"""The validity rule that a trained model must beat the trivial predictor."""

from tasks.run.record.baseline import no_better_than_baseline


def test_accuracy_at_or_below_the_majority_rate_is_invalid():
    assert no_better_than_baseline({"quality.accuracy": 0.48, "quality.majority_rate": 0.49})
    assert no_better_than_baseline({"quality.accuracy": 0.49, "quality.majority_rate": 0.49})
    assert not no_better_than_baseline({"quality.accuracy": 0.9, "quality.majority_rate": 0.49})


def test_mae_no_better_than_predicting_the_mean_is_invalid():
    reasons = no_better_than_baseline({"quality.mae": 2.0, "quality.mae_of_mean": 1.5})
    assert reasons and "quality.mae_of_mean" in reasons[0]
    assert not no_better_than_baseline({"quality.mae": 1.0, "quality.mae_of_mean": 1.5})
    assert not no_better_than_baseline({})


def test_nan_quality_is_invalid_with_its_reason():
    # every comparison with NaN is false, so NaN once passed both rules
    nan = float("nan")
    for metrics, key in [
        ({"quality.accuracy": nan, "quality.majority_rate": 0.5}, "quality.accuracy"),
        ({"quality.accuracy": 0.9, "quality.majority_rate": nan}, "quality.majority_rate"),
        ({"quality.accuracy": 0.9, "quality.majority_rate": 0.5, "quality.auc": nan}, "quality.auc"),
        ({"quality.mae": nan, "quality.mae_of_mean": 1.5}, "quality.mae"),
    ]:
        reasons = no_better_than_baseline(metrics)
        assert len(reasons) == 1 and reasons[0].startswith(f"{key} is NaN"), (metrics, reasons)
