"""The noise floor: between-run CV, the minimum detectable effect, a run's own steady-window CV."""

from __future__ import annotations

import math
import statistics

import pytest

from tasks.measure import keys as K
from tasks.measure.noise import cv, mde, mde_two
from tasks.measure.records import PhaseTimings


def test_mde_matches_the_hand_computed_value():
    # 6 runs a side, CV 5%: df = 10, t(0.975, 10) = 2.228139, t(0.80, 10) = 0.879058 (tables),
    # (2.228139 + 0.879058) * 0.05 * sqrt(2 / 6) = 0.089697
    assert mde(0.05, 6) == pytest.approx(0.089697, abs=2e-6)
    # 3 vs 9 runs, CVs 4% and 2%: df = 10 again; 3.107197 * sqrt(0.04**2 / 3 + 0.02**2 / 9) = 0.074688
    assert mde_two(0.04, 3, 0.02, 9) == pytest.approx(0.074688, abs=2e-6)


def test_more_runs_or_less_noise_detect_smaller_changes():
    assert mde(0.05, 12) < mde(0.05, 6) < mde(0.05, 3)
    assert mde(0.025, 6) == pytest.approx(mde(0.05, 6) / 2)


def test_mde_needs_two_runs_a_side():
    assert math.isnan(mde(0.05, 1))
    assert math.isnan(mde_two(0.05, 6, math.nan, 6))


def test_cv_is_the_sample_standard_deviation_over_the_mean():
    values = [90.0, 100.0, 110.0]
    assert cv(values) == pytest.approx(statistics.stdev(values) / 100.0)
    assert math.isnan(cv([5.0]))


def test_steady_window_cv_leaves_out_a_chunks_smaller_last_batch():
    t = PhaseTimings(warmup_batches=0)
    t.record(1.0, 512)  # the first call: not in the steady window
    for seconds, rows in ((0.10, 512), (0.12, 512), (0.11, 512), (0.02, 40)):
        t.record(seconds, rows)
    m = t.metrics(lambda what: K.compute("predict", what))
    assert m["compute.steady_batch_ms.cv"] == pytest.approx(statistics.stdev([0.10, 0.12, 0.11]) / 0.11)
    train = t.metrics(lambda what: K.compute("train", what))
    assert "compute.train.steady_batch_ms.cv" in train


def test_no_steady_cv_from_a_single_batch():
    t = PhaseTimings(warmup_batches=0)
    t.record(1.0, 512)
    t.record(0.1, 512)
    assert "compute.steady_batch_ms.cv" not in t.metrics(lambda what: K.compute("predict", what))
