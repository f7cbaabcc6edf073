"""The step detector on synthetic series: persistent shifts are steps, outliers are not."""

from __future__ import annotations

import numpy as np
import pytest

from dashboards.history import detect_steps, history
from tasks.tracking.reader import StoredRun


def noisy(level: float, n: int, rng: np.random.Generator, noise: float = 0.03) -> list[float]:
    return list(level * (1 + noise * rng.standard_normal(n)))


def test_step_down_is_detected_at_the_shift():
    rng = np.random.default_rng(0)
    values = noisy(1000, 12, rng) + noisy(700, 10, rng)
    steps = detect_steps(values)
    assert [s.index for s in steps] == [12]
    assert steps[0].ratio == pytest.approx(0.7, rel=0.05)


def test_two_steps_are_both_found():
    rng = np.random.default_rng(1)
    values = noisy(1000, 8, rng) + noisy(1300, 8, rng) + noisy(900, 8, rng)
    assert [s.index for s in detect_steps(values)] == [8, 16]


@pytest.mark.parametrize("where", [0, 7, 15, 19])
def test_single_outlier_is_not_a_step(where):
    rng = np.random.default_rng(2)
    values = noisy(1000, 20, rng)
    values[where] = 400.0  # one bad run: a busy machine, not a regression
    assert detect_steps(values) == []


def test_pure_noise_gives_no_steps():
    for seed in range(20):
        rng = np.random.default_rng(100 + seed)
        assert detect_steps(noisy(1000, 30, rng, noise=0.08)) == [], seed


def test_shift_below_threshold_is_ignored():
    values = [1000.0] * 10 + [1030.0] * 10  # 3%: exact, but under the 5% threshold
    assert detect_steps(values) == []
    assert [s.index for s in detect_steps(values, threshold=0.02)] == [10]


def test_a_new_level_needs_min_segment_points():
    values = [1000.0] * 10 + [600.0] * 2
    assert detect_steps(values, min_segment=3) == []
    assert [s.index for s in detect_steps(values + [600.0], min_segment=3)] == [10]


def test_bad_arguments():
    with pytest.raises(ValueError):
        detect_steps([1.0, 2.0], min_segment=1)
    with pytest.raises(ValueError):
        detect_steps([1.0, -2.0, 3.0])


def _run(i: int, value: float) -> StoredRun:
    return StoredRun(
        f"run{i:02d}",
        f"r{i}",
        "exp",
        "FINISHED",
        1_700_000_000_000 + i * 60_000,
        None,
        {"e2e.predict.rows_per_s": value},
        {},
        {"relflow.git_sha": "a" if i < 6 else "b"},
    )


def test_history_labels_a_drop_a_regression_with_the_runs_around_it():
    runs = [_run(i, v) for i, v in enumerate([100, 101, 99, 100, 102, 100, 80, 81, 79, 80])]
    (step,) = history(runs, "e2e.predict.rows_per_s")
    assert step.kind == "regression"
    assert (step.before_run.run_id, step.after_run.run_id) == ("run05", "run06")
