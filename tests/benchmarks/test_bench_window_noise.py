"""bench_window_noise's figures on scripted batch records, where every rate is known exactly."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_window_noise import rate_over, table  # noqa: E402


def steady(rate_rows_per_s: float, seconds: float, rows: float = 100.0) -> dict[str, list[float]]:
    """A process whose batches of ``rows`` end every rows / rate seconds."""
    step = rows / rate_rows_per_s
    n = round(seconds / step)
    return {"ends": [step * (i + 1) for i in range(n)], "rows": [rows] * n}


def test_rate_over_counts_from_the_end_of_the_batch_before_the_window():
    ends, rows = np.array([0.5, 1.0, 1.5, 2.0]), np.array([100.0, 100.0, 300.0, 300.0])
    assert rate_over(ends, rows, 0.0, 1.0) == pytest.approx(200.0)  # 200 rows in 1 s
    assert rate_over(ends, rows, 1.0, 2.0) == pytest.approx(600.0)  # 600 rows from 1.0 to 2.0


def test_between_process_cv_of_two_constant_rates():
    got = table([steady(10_000, 4), steady(8_000, 4)], (1.0, 2.0))
    sd = np.std([10_000, 8_000], ddof=1)
    for row in got:
        assert row["between_cv"] == pytest.approx(sd / 9_000)  # 0.157135
        assert row["median_rows_per_s"] == pytest.approx(9_000)
        assert row["within_cv"] == pytest.approx(0.0, abs=1e-9)


def test_within_process_cv_sees_a_host_that_slows_down():
    fast, slow = steady(10_000, 1), steady(5_000, 1)
    drift = {"ends": fast["ends"] + [1 + e for e in slow["ends"]], "rows": fast["rows"] + slow["rows"]}
    (w1,) = table([drift, drift], (1.0,))
    assert w1["within_cv"] == pytest.approx(np.std([10_000, 5_000], ddof=1) / 7_500)  # 0.471405
    assert w1["between_cv"] == pytest.approx(0.0, abs=1e-9)  # both processes start alike
