"""The run report that crosses processes, and the summaries built from many of them."""

from __future__ import annotations

import json
import math

import pytest

from tasks.measure import keys as K
from tasks.measure.report import (
    RunSummary,
    Sample,
    interval_text,
    markdown_table,
    ratio_interval,
    summarize,
)
from tasks.tracking.reader import StoredRun

# What `relflow-bench run --json` writes (flows/benchmark.py's summary), one key it does not know.
SUMMARY = {
    "run_id": "abc123",
    "experiment": "tpch-orders",
    "experiment_id": "7",
    "tracking_uri": "sqlite:////tmp/mlflow.db",
    "metrics": {K.STEADY_ROWS_PER_S: 1234.5, K.E2E_PREDICT_ROWS_PER_S: 456.0, "quality.accuracy": 0.75},
    "stages": [{"phase": "predict", "stage": "retrieve", "seconds": 0.25, "rows": 1000.0}],
    "output_path": "/tmp/out/pred.parquet",
    "checkpoint_path": None,
    "quality_meaningful": True,
    "quality_metric": "accuracy",
    "generated_data": False,
    "encoder_path": "packed",
    "validity": "INVALID",
    "invalid_reasons": ["too few rows"],
    "profile": {},
    "written_by_a_newer_child": {"x": 1},
}


def test_the_summary_round_trips_exactly_unknown_keys_included():
    r = RunSummary.from_json(json.dumps(SUMMARY))
    assert r.metrics[K.STEADY_ROWS_PER_S] == 1234.5 and r.quality == 0.75 and r.validity == "INVALID"
    assert r.stages[0]["stage"] == "retrieve" and r.invalid_reasons == ["too few rows"]
    assert json.loads(r.to_json()) == SUMMARY  # the same format the child wrote
    assert RunSummary.from_json(r.to_json()) == r
    assert math.isnan(r.metric("compute.never_logged"))


def test_a_file_that_is_not_a_run_summary_is_refused_by_name():
    with pytest.raises(ValueError, match="lacks metrics, validity"):
        RunSummary.from_json(json.dumps({"run_id": "x"}))


def test_from_record_reads_the_same_figures_from_mlflow():
    rec = StoredRun(
        run_id="r1",
        run_name="n",
        experiment="e",
        status="FINISHED",
        start_time_ms=0,
        end_time_ms=1,
        metrics={"quality.auc": 0.9},
        params={"task.kind": "binary"},
        tags={"relflow.validity": "VALID", "relflow.invalid_reasons": "", "relflow.error": "boom"},
    )
    r = RunSummary.from_record(rec)
    assert (r.run_id, r.validity, r.quality_metric, r.quality, r.invalid_reasons) == ("r1", "VALID", "auc", 0.9, [])
    assert r.tags["relflow.error"] == "boom"


def test_interval_of_a_paired_ratio_has_the_known_order_statistics():
    # Nine rounds; the baseline drifts (100, 200, ..., 900 rows/s) and each round's variant is
    # a known multiple of that round's baseline: ratios 1..9 in a shuffled round order.
    multiples = [5, 1, 9, 3, 7, 2, 8, 4, 6]
    base = {r: 100.0 * (r + 1) for r in range(9)}
    variant = {r: base[r] * m for r, m in enumerate(multiples)}
    mi = ratio_interval(variant, base)
    assert mi is not None
    # n = 9: k = 2 is the largest with coverage >= 95% (1 - 2 * 10/512 = 0.9609375), so the
    # interval is [2nd smallest, 2nd largest] of the ratios.
    assert (mi.median, mi.low, mi.high, mi.n) == (5.0, 2.0, 8.0, 9)
    assert mi.level == pytest.approx(1 - 2 * 10 / 512)
    # a round that only one side ran, or a zero baseline, is no pair
    assert ratio_interval({0: 2.0, 1: 4.0}, {0: 1.0, 2: 3.0}).n == 1  # type: ignore[union-attr]
    assert ratio_interval({0: 2.0}, {0: 0.0}) is None
    # five pairs: a median, no 95% interval
    five = ratio_interval({r: 2.0 * (r + 1) for r in range(5)}, {r: 1.0 for r in range(5)})
    assert five is not None and five.median == 6.0 and not five.has_interval


def test_summarize_groups_in_order_and_failed_rounds_have_no_figures():
    samples = [
        Sample("b", 0, RunSummary("1", {"m": 3.0}, "VALID")),
        Sample("a", 0, RunSummary("2", {"m": 10.0}, "VALID")),
        Sample("b", 1, RunSummary("3", {"m": 5.0}, "INVALID")),
        Sample("a", 1, None),
    ]
    rows = summarize(samples, {"m": lambda g: g.median("m"), "ok": lambda g: len(g.reports)})
    assert rows == [{"variant": "b", "m": 4.0, "ok": 2}, {"variant": "a", "m": 10.0, "ok": 1}]
    assert [s.validity for s in samples] == ["VALID", "VALID", "INVALID", "FAILED"]


def test_one_table_format():
    assert interval_text(None, None, 3) == "n=3<6, no CI"
    assert interval_text(1234.4, 5678.9, 6) == "1,234, 5,679"
    assert markdown_table(["a", "b"], [["1", "2"]]) == "| a | b |\n|---|---|\n| 1 | 2 |"
