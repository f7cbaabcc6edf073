"""The noise floor: between-run CV and a run's own steady-window CV (the MDE: test_significance.py)."""

from __future__ import annotations

import math
import statistics

import pytest

from tasks.measure import keys as K
from tasks.measure.noise import cv
from tasks.measure.records import PhaseTimings


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
