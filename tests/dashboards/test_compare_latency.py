"""compare / history / dashboard on request-scenario runs: latency keys compared lower-is-
better, a latency rise is a history regression, and the dashboard draws a latency CDF.

Named ``test_compare_latency.py`` (tests/README.md): test_compare.py holds compare's own unit tests;
this file is one aspect (request runs' latency keys, with history and the dashboard's CDF)."""

from __future__ import annotations

import pytest

from dashboards import figures
from dashboards.compare import compare
from dashboards.history import history
from tasks.tracking.reader import StoredRun


def _run(i: int, p50: float, p99: float, scenario: str = "single_stream") -> StoredRun:
    m = {
        "e2e.predict.rows_per_s": 100.0,
        "latency.requests": 50.0,
        "latency.request_ms.p50": p50,
        "latency.request_ms.p90": p50 * 1.5,
        "latency.request_ms.p99": p99,
        "latency.request_ms.max": p99 * 1.2,
        "latency.first_request_ms": 90.0,
    }
    return StoredRun(
        f"run{i:02d}",
        "r",
        "e",
        "FINISHED",
        1_000 * i,
        1_000 * i + 1,
        m,
        {"run.scenario": scenario, "run.request.latency_bound_ms": "20"},
        {"relflow.host_fingerprint": "h", "relflow.spec_hash": "s", "relflow.validity": "VALID"},
    )


def test_compare_shows_latency_lower_is_better():
    c = compare([_run(0, 10.0, 20.0)], [_run(1, 5.0, 10.0)])
    rows = {r.key: r for r in c.rows}
    assert rows["latency.request_ms.p99"].direction == -1
    assert rows["latency.request_ms.p99"].ratio == 0.5
    assert "latency.first_request_ms" in rows


def test_history_calls_a_latency_rise_a_regression():
    runs = [_run(i, 10.0 + 0.01 * (i % 3), 20.0) for i in range(6)]
    runs += [_run(i, 15.0 + 0.01 * (i % 3), 20.0) for i in range(6, 12)]
    steps = history(runs, "latency.request_ms.p50")
    assert len(steps) == 1 and steps[0].kind == "regression"
    assert steps[0].after_run.run_id == "run06"


def test_latency_cdf_uses_the_logged_series_or_the_percentiles():
    a, b = _run(0, 10.0, 20.0), _run(1, 5.0, 9.0, "server")
    cdf = [float(v) for v in range(1, 102)]
    fig = figures.latency_cdf([a, b], {a.run_id: cdf})
    assert len(fig.data) == 2
    assert list(fig.data[0].x) == cdf and fig.data[0].y[-1] == 100.0
    assert list(fig.data[1].x) == pytest.approx([5.0, 7.5, 9.0, 10.8])  # p50, p90, p99, max
    assert "server" in fig.data[1].name
    empty = figures.latency_cdf([], {})
    assert "no single_stream or server runs" in empty.layout.annotations[0].text
    # offline runs keep the two throughput rows of the history chart
    offline = [StoredRun("x", "r", "e", "FINISHED", 0, 1, {"e2e.predict.rows_per_s": 1.0}, {}, {})]
    assert len(figures.history_figure(offline, []).layout.annotations) == 2
