"""compare and history judge request runs (single_stream, server) by their latency figures:
their ``e2e.predict.rows_per_s`` is rows per second of service time with the cold call
included (tasks/measure/keys.py), not a throughput, so it is neither compare's first row nor a
history series for them. Offline runs, and mixed groups, keep throughput first."""

from __future__ import annotations

from dashboards.compare import compare, key_metrics
from dashboards.history import HISTORY_METRICS, history, series
from tasks.measure import keys as K
from tasks.tracking.reader import StoredRun


def _run(i: int, rows_per_s: float, p99: float | None) -> StoredRun:
    m = {K.E2E_PREDICT_ROWS_PER_S: rows_per_s, K.STEADY_ROWS_PER_S: 1000.0}
    if p99 is not None:  # a request run
        m |= {K.LATENCY_REQUESTS: 64.0, K.latency_request_ms(50): p99 / 2, K.latency_request_ms(99): p99}
    return StoredRun(
        f"run{i:02d}",
        "r",
        "e",
        "FINISHED",
        1_000 * i,
        1_000 * i + 1,
        m,
        {},
        {"relflow.host_fingerprint": "h", "relflow.spec_hash": "s", "relflow.validity": "VALID"},
    )


def test_compare_judges_request_runs_by_latency_first_and_not_by_service_rows_per_s():
    base = [_run(i, 100.0, 10.0) for i in range(3)]
    cand = [_run(10 + i, 50.0, 10.0) for i in range(3)]  # "half the rows/s", the same latency
    c = compare(base, cand)
    keys = [r.key for r in c.rows]
    assert keys[0] == K.latency_request_ms(50) and keys[1] == K.latency_request_ms(99)
    assert K.E2E_PREDICT_ROWS_PER_S not in keys
    assert not c.regressions
    # the family compare tests (and Holm corrects over) leaves it out too
    assert K.E2E_PREDICT_ROWS_PER_S not in [k for k, _ in key_metrics([r.metrics for r in base + cand])]


def test_offline_and_mixed_groups_keep_throughput_first():
    offline = [_run(i, 100.0, None) for i in range(2)]
    assert [r.key for r in compare(offline[:1], offline[1:]).rows][0] == K.E2E_PREDICT_ROWS_PER_S
    mixed = [offline[0].metrics, _run(5, 100.0, 10.0).metrics]
    assert key_metrics(mixed)[0] == (K.E2E_PREDICT_ROWS_PER_S, +1)


def test_history_walks_request_runs_by_latency_not_by_service_rows_per_s():
    # service rows/s halves after run 6 (e.g. a slower cold call); latency stays put
    runs = [_run(i, 100.0 + 0.1 * (i % 3) if i < 6 else 50.0 + 0.1 * (i % 3), 10.0 + 0.01 * (i % 2)) for i in range(12)]
    assert series(runs, K.E2E_PREDICT_ROWS_PER_S) == ([], [])
    steps = [s for key in HISTORY_METRICS for s in history(runs, key)]
    assert steps == []
    # the same values on offline runs are a regression
    offline = [_run(i, r.metrics[K.E2E_PREDICT_ROWS_PER_S], None) for i, r in enumerate(runs)]
    found = history(offline, K.E2E_PREDICT_ROWS_PER_S)
    assert len(found) == 1 and found[0].kind == "regression" and found[0].after_run.run_id == "run06"
    # and a latency rise on request runs still is one
    slower = [_run(i, 100.0, (10.0 if i < 6 else 20.0) + 0.01 * (i % 2)) for i in range(12)]
    rise = history(slower, K.latency_request_ms(99))
    assert len(rise) == 1 and rise[0].kind == "regression"
