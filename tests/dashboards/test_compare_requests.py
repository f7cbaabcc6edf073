"""compare and history judge request runs (single_stream, server) per request: by their latency
figures and each step's mean per request, never by what sums over however many requests the run
served (``stage.<stage>.predict.seconds``, ``quality.rows``), nor by ``e2e.predict.rows_per_s``
(rows per second of service time with the cold call included, tasks/measure/keys.py), which is
neither compare's first row nor a history series for them. Offline runs, and mixed groups, keep
throughput first. Every comparison here has 6 runs a side, where a mark is reachable: a check
that nothing is marked is a check that something could have been.

Named ``test_compare_requests.py`` (tests/README.md): test_compare.py holds compare's own unit
tests; this file is one aspect (how compare and history judge request runs)."""

from __future__ import annotations

import pytest

from dashboards.compare import compare, key_metrics
from dashboards.history import HISTORY_METRICS, history, series
from tasks.measure import keys as K
from tasks.tracking.reader import StoredRun

NOISE = [1.0, 1.01, 0.99, 1.005, 0.995, 1.002]  # run-to-run spread, under 1%
STEP_MS = {"retrieve": 0.5, "preprocess": 1.0, "tensorize": 0.4, "compute": 6.0, "calibrate": 0.0, "write": 0.3}


def _stored(i: int, m: dict[str, float]) -> StoredRun:
    tags = {"relflow.host_fingerprint": "h", "relflow.spec_hash": "s", "relflow.validity": "VALID"}
    return StoredRun(f"run{i:02d}", "r", "e", "FINISHED", 1_000 * i, 1_000 * i + 1, m, {}, tags)


def _run(i: int, rows_per_s: float, p99: float | None) -> StoredRun:
    m = {K.E2E_PREDICT_ROWS_PER_S: rows_per_s, K.STEADY_ROWS_PER_S: 1000.0}
    if p99 is not None:  # a request run
        m |= {K.LATENCY_REQUESTS: 64.0, K.latency_request_ms(50): p99 / 2, K.latency_request_ms(99): p99}
    return _stored(i, m)


def test_compare_judges_request_runs_by_latency_first_and_not_by_service_rows_per_s():
    # 6 vs 6: the candidate's service rows/s halves in every run (a slower cold call), its p99
    # falls 30%. The p99 is marked, so marks are reachable here; rows/s is not shown at all.
    base = [_run(i, 100.0 * n, 10.0 * n) for i, n in enumerate(NOISE)]
    cand = [_run(10 + i, 50.0 * n, 7.0 * n) for i, n in enumerate(NOISE)]
    c = compare(base, cand)
    keys = [r.key for r in c.rows]
    assert keys[0] == K.latency_request_ms(50) and keys[1] == K.latency_request_ms(99)
    assert K.E2E_PREDICT_ROWS_PER_S not in keys
    assert {r.key: r.verdict for r in c.marked} == {
        K.latency_request_ms(50): "improvement",
        K.latency_request_ms(99): "improvement",
    }
    assert not c.regressions
    # the family compare tests (and Holm corrects over) leaves it out too
    assert K.E2E_PREDICT_ROWS_PER_S not in [k for k, _ in key_metrics([r.metrics for r in base + cand])]


def _served(i: int, requests: float, compute_ms: float, noise: float) -> StoredRun:
    """A single_stream run that served ``requests`` requests: each step's mean per request
    (``latency.step_ms.<step>.mean``) and the stage seconds, their sum over the requests served;
    the same for quality: rows of every served request, majority rate of those rows."""
    steps = {**STEP_MS, "compute": compute_ms}
    m = {
        K.LATENCY_REQUESTS: requests,
        K.latency_request_ms(50): 8.0 * noise,
        K.latency_request_ms(99): 12.0 * noise,
        K.E2E_PREDICT_ROWS_PER_S: 1000.0 * noise,
        K.quality("accuracy"): 0.8 * noise,
        K.QUALITY_ROWS: 4.0 * requests,
        K.quality("majority_rate"): 0.6 + 0.001 * i,  # of the rows the run happened to serve
    }
    for s, ms in steps.items():
        m[K.latency_step_ms_mean(s)] = ms * noise if ms else 0.0  # calibration off: 0 in every run
        m[K.stage_seconds(s, "predict")] = requests * ms * noise / 1e3
    return _stored(i, m)


def test_a_faster_model_that_served_more_requests_is_judged_per_request():
    # Failed before: compare compared the stage seconds, sums over the requests served. The
    # candidate's compute step is 20% faster per request and every other step the same, but it
    # served twice the requests in its duration, so its stage seconds doubled (1.6x for compute):
    # five "regressions", and quality.rows a marked "change".
    base = [_served(i, 500.0, 6.0, n) for i, n in enumerate(NOISE)]
    cand = [_served(10 + i, 1000.0, 4.8, n) for i, n in enumerate(NOISE)]
    c = compare(base, cand)
    rows = {r.key: r for r in c.rows}
    assert not c.regressions, [(r.key, r.ratio) for r in c.regressions]
    assert [r.key for r in c.marked] == [K.latency_step_ms_mean("compute")]
    assert rows[K.latency_step_ms_mean("compute")].verdict == "improvement"
    assert rows[K.latency_step_ms_mean("compute")].ratio == pytest.approx(0.8)
    for s in ("retrieve", "preprocess", "tensorize", "write"):
        assert rows[K.latency_step_ms_mean(s)].verdict == "same"
    assert not any(k in rows for k in (*(K.stage_seconds(s, "predict") for s in K.STAGES), K.QUALITY_ROWS))
    # the step means stand where the stage seconds stand, after the latency figures
    keys = list(rows)
    assert keys[:2] == [K.latency_request_ms(50), K.latency_request_ms(99)]
    assert keys[2:8] == [K.latency_step_ms_mean(s) for s in K.STAGES]
    # Holm's family: p50, p99, five step means, accuracy. Not calibrate (0 in every run of both
    # sides: its test cannot give p < 1) and not the majority rate (a figure of the rows served)
    assert c.tested_metrics == 8
    assert (rows[K.latency_step_ms_mean("calibrate")].method, rows[K.latency_step_ms_mean("calibrate")].verdict) == (
        "exact",
        "same",
    )
    majority = rows[K.quality("majority_rate")]
    assert (majority.method, majority.marked, majority.p_value) == ("data", False, None)


def test_a_step_outside_the_stages_is_compared_per_request_too():
    # a step outside the stages (encode, with text columns) is compared per request as well
    base = [_served(i, 500.0, 6.0, n) for i, n in enumerate(NOISE)]
    for r in base:
        r.metrics[K.latency_step_ms_mean("encode")] = 2.0
    assert (K.latency_step_ms_mean("encode"), -1) in key_metrics([r.metrics for r in base])


def test_offline_and_mixed_groups_keep_throughput_first():
    offline = [_run(i, 100.0, None) for i in range(2)]
    assert [r.key for r in compare(offline[:1], offline[1:]).rows][0] == K.E2E_PREDICT_ROWS_PER_S
    mixed = [offline[0].metrics, _run(5, 100.0, 10.0).metrics]
    assert key_metrics(mixed)[0] == (K.E2E_PREDICT_ROWS_PER_S, +1)
    assert K.stage_seconds("compute", "predict") in [k for k, _ in key_metrics(mixed)]


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
