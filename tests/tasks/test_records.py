"""Measurement records: warm-up never mixes into steady state, exact rows, percentiles,
confidence intervals, validity rules."""

from __future__ import annotations

import pytest

from tasks.clock import Clock
from tasks.records import PhaseTimings, RunResult
from tasks.spec import parse_spec
from tasks.stats import median_ci
from tasks.validity import verdict


def test_first_call_and_warmup_are_kept_out_of_steady_state():
    t = PhaseTimings(warmup_batches=2)
    for seconds, rows in [(10.0, 4), (5.0, 4), (4.0, 4), (1.0, 4), (1.0, 4), (0.5, 2)]:
        t.record(seconds, rows)
    assert t.first_call_seconds == 10.0
    assert t.warmup_seconds == [5.0, 4.0]
    assert t.steady_seconds == [1.0, 1.0, 0.5]
    assert t.steady_rows_per_s == pytest.approx(10 / 2.5)  # exact rows: a partial last batch of 2
    m = t.metrics("compute")
    assert m["compute.batch_ms.p50"] <= m["compute.batch_ms.p95"] <= m["compute.batch_ms.p99"]
    assert m["compute.compile_overhead_seconds"] == pytest.approx(10.0 - 1.0)


def test_steady_state_flag_flips_after_warmup():
    t = PhaseTimings(warmup_batches=1)
    assert not t.in_steady_state
    t.record(1.0, 1)
    assert not t.in_steady_state
    t.record(1.0, 1)
    assert t.in_steady_state


def test_bootstrap_ci_contains_median_and_collapses_for_one_sample():
    med, lo, hi = median_ci([10.0, 12.0, 11.0, 30.0, 9.0])
    assert lo <= med <= hi and med == 11.0
    assert median_ci([7.0]) == (7.0, 7.0, 7.0)


def test_e2e_is_the_sum_of_the_five_stages_and_rows_are_exact():
    r = RunResult()
    for i, stage in enumerate(r.stages.values()):
        stage.add(float(i + 1), 100)
    r.rows_predicted = 100
    r.repeat_e2e_rows_per_s = [6.0, 7.0, 8.0]
    m = r.metrics()
    assert m["e2e.seconds"] == pytest.approx(15.0)
    assert m["e2e.rows_per_s"] == pytest.approx(100 / 15.0)
    assert m["e2e.rows_per_s.ci_low"] <= m["e2e.rows_per_s.median"] <= m["e2e.rows_per_s.ci_high"]
    assert {f"stage.{s}.rows_per_s" for s in r.stages} <= set(m)


def test_fake_clock_measures_exactly():
    ticks = iter([1.0, 3.5])
    with Clock(now=lambda: next(ticks)).measure() as span:
        pass
    assert span.seconds == 2.5


def _spec(**run):
    return parse_spec({
        "name": "t", "source": {"tables": {"a": "a.parquet"}},
        "schema": {"root": {"table": "a", "key": "k", "columns": {"x": "numeric"}}},
        "task": {"target": "y", "kind": "category", "min_quality": 0.9},
        "run": run,
    })


def test_validity_rules_name_each_failed_rule():
    spec = _spec(min_steady_batches=100000, max_recompiles=0)
    metrics = {"compute.steady_batches": 50, "compute.steady_seconds": 5.0,
               "compute.recompiles": 2, "quality.accuracy": 0.5}
    reasons = verdict(spec, metrics, "accuracy")
    assert any("run.min_steady_batches 100000" in r for r in reasons)
    assert any("compute.recompiles 2" in r for r in reasons)
    assert any("task.min_quality" in r for r in reasons)
    ok = {"compute.steady_batches": 200000, "compute.steady_seconds": 5.0, "quality.accuracy": 0.95}
    assert verdict(spec, ok, "accuracy") == []


def test_host_load_rule_is_opt_in_and_named():
    metrics = {"compute.steady_batches": 200000, "compute.steady_seconds": 5.0, "quality.accuracy": 0.95,
               "host.load_per_core_start": 4.2, "host.load_per_core_end": 0.5}
    assert verdict(_spec(), metrics, "accuracy") == []
    reasons = verdict(_spec(max_host_load=1.0), metrics, "accuracy")
    assert reasons == ["host.load_per_core_start 4.20 > run.max_host_load 1.0"]
