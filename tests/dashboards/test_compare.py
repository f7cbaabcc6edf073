"""``compare``: real runs (batch size 16 vs 512 is flagged, two runs of one configuration are
not), then the decision rules on hand-made estimates, and the CLI on the real store."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from dashboards.compare import CI_LABEL, NOT_ENOUGH, Estimate, _mann_whitney_u, compare, estimate, judge, split_by
from tasks.runtime.errors import UserError
from tasks.tracking.store import RunRecord, get_run_record, search_runs

THROUGHPUT = ("e2e.predict.rows_per_s", "compute.steady_rows_per_s")


def _rows(c):
    return {r.key: r for r in c.rows}


@pytest.mark.slow
def test_batch_16_vs_512_is_flagged(bench_runs):
    base = get_run_record(bench_runs.a_512, bench_runs.uri)
    cand = get_run_record(bench_runs.c_16, bench_runs.uri)
    assert base.metrics["run.repeats_measured"] == 6
    c = compare([base], [cand])
    steady = _rows(c)["compute.steady_rows_per_s"]
    assert steady.method == CI_LABEL
    assert steady.marked, steady
    assert abs(math.log(steady.ratio)) > math.log(1.5), steady.ratio  # a real, large difference
    assert steady.verdict in ("regression", "improvement")
    assert {d.key: (d.baseline, d.candidate) for d in c.param_differences}["run.batch_size"] == ("512", "16")


@pytest.mark.slow
def test_two_runs_of_one_configuration_are_not_flagged(bench_runs):
    a = get_run_record(bench_runs.a_512, bench_runs.uri)
    b = get_run_record(bench_runs.b_512, bench_runs.uri)
    c = compare([a], [b])
    rows = _rows(c)
    assert all(rows[k].method == CI_LABEL for k in THROUGHPUT)
    assert not c.marked, [(r.key, r.ratio, r.baseline, r.candidate) for r in c.marked]
    assert not [d for d in c.param_differences if not d.key.startswith("run.output")]


@pytest.mark.slow
def test_cli_compare_by_ids_and_by_param_groups(bench_runs):
    from flows.cli.app import app

    env = {"MLFLOW_TRACKING_URI": bench_runs.uri, "COLUMNS": "200"}
    res = CliRunner().invoke(
        app, ["compare", bench_runs.a_512, bench_runs.c_16, "--json", str(bench_runs.folder / "cmp.json")], env=env
    )
    assert res.exit_code == 0, res.output
    assert "compute.steady_rows_per_s" in res.output and "run.batch_size" in res.output
    data = json.loads((bench_runs.folder / "cmp.json").read_text())
    assert any(m["marked"] and m["key"] == "compute.steady_rows_per_s" for m in data["metrics"])

    res = CliRunner().invoke(
        app, ["compare", "--experiment", "tpch-orders", "--baseline", "params.run.batch_size=512"], env=env
    )
    assert res.exit_code == 0, res.output
    assert "(2 runs)" in res.output and "(1 runs)" in res.output

    res = CliRunner().invoke(app, ["compare", bench_runs.a_512], env=env)
    assert res.exit_code == 2


@pytest.mark.slow
def test_groups_split_by_tag(bench_runs):
    runs = search_runs("tpch-orders", uri=bench_runs.uri)
    base, cand, value = split_by(runs, "relflow.test_batch", "512")
    assert (len(base), len(cand), value) == (2, 1, "16")
    with pytest.raises(UserError, match="--candidate"):
        split_by(runs, "params.run.batch_size", "999")


# --- the decision rules ---------------------------------------------------------------


def est(value, low=None, high=None, samples=None):
    samples = tuple(samples or (value,))
    interval = low is not None or len(samples) > 1
    return Estimate(value, low if low is not None else value, high if high is not None else value, samples, interval)


def test_disjoint_intervals_beyond_threshold_are_marked():
    row = judge("e2e.predict.rows_per_s", +1, est(100, 98, 102), est(50, 49, 51), threshold=0.05, alpha=0.05)
    assert (row.method, row.marked, row.verdict) == (CI_LABEL, True, "regression")


def test_overlapping_intervals_are_noise_however_large_the_ratio():
    row = judge("e2e.predict.rows_per_s", +1, est(100, 60, 140), est(80, 70, 130), threshold=0.05, alpha=0.05)
    assert (row.marked, row.verdict) == (False, "within noise")


def test_disjoint_but_close_intervals_are_below_threshold():
    # medians 8% apart, but the intervals are only 2% apart: not marked
    row = judge("e2e.predict.rows_per_s", +1, est(100, 99, 102), est(108, 104, 110), threshold=0.05, alpha=0.05)
    assert (row.significant, row.marked, row.verdict) == (True, False, "below threshold")


def test_single_values_are_not_enough_repeats():
    row = judge("stage.compute.predict.seconds", -1, est(10.0), est(20.0), threshold=0.05, alpha=0.05)
    assert (row.method, row.marked, row.verdict) == (NOT_ENOUGH, False, NOT_ENOUGH)


def test_groups_use_the_rank_test():
    a = est(100, samples=[99, 100, 101, 102, 98])
    b = est(130, samples=[129, 131, 130, 128, 132])
    row = judge("compute.steady_rows_per_s", +1, a, b, threshold=0.05, alpha=0.05)
    assert row.method == "Mann-Whitney U" and row.p_value < 0.05
    assert (row.marked, row.verdict) == (True, "improvement")
    same = judge(
        "compute.steady_rows_per_s", +1, a, est(100, samples=[100, 99, 101, 102, 98]), threshold=0.05, alpha=0.05
    )
    assert not same.marked


def _record(run_id: str, metrics: dict) -> RunRecord:
    return RunRecord(run_id, "r", "e", "FINISHED", 0, 1, metrics, {}, {})


def test_three_repeats_give_a_median_but_no_interval_so_nothing_is_claimed():
    # a run with 3 passes logs the median only: 3 samples support no 95% interval
    a = _record(
        "a", {"e2e.predict.rows_per_s": 100.0, "e2e.predict.rows_per_s.median": 100.0, "run.repeats_measured": 3.0}
    )
    b = _record(
        "b", {"e2e.predict.rows_per_s": 50.0, "e2e.predict.rows_per_s.median": 50.0, "run.repeats_measured": 3.0}
    )
    c = compare([a], [b])
    row = _rows(c)["e2e.predict.rows_per_s"]
    assert (row.method, row.marked) == (NOT_ENOUGH, False)
    assert any("run.repeats=6" in n for n in c.notes)


def test_group_intervals_need_six_runs():
    three = [_record(str(i), {"e2e.predict.rows_per_s": v}) for i, v in enumerate([9.0, 10.0, 11.0])]
    assert not estimate(three, "e2e.predict.rows_per_s").has_interval
    six = [_record(str(i), {"e2e.predict.rows_per_s": float(v)}) for i, v in enumerate(range(6))]
    e = estimate(six, "e2e.predict.rows_per_s")
    assert e.has_interval and (e.low, e.high) == (0.0, 5.0)


@pytest.mark.parametrize(
    "x,y", [([1, 2, 3, 4], [5, 6, 7, 8]), ([1, 3, 5, 7, 9], [2, 4, 6, 8, 10, 12]), ([1, 2, 2, 3], [2, 3, 4, 4, 5])]
)
def test_own_mann_whitney_matches_scipy(x, y):
    scipy_stats = pytest.importorskip("scipy.stats")
    expected = scipy_stats.mannwhitneyu(x, y, alternative="two-sided").pvalue
    assert _mann_whitney_u(x, y) == pytest.approx(expected, rel=0.05, abs=0.01)
