"""``compare``: real runs (one run a side shows the ratio and claims nothing, however large),
then the decision rules on hand-made records (significance only from independent runs, Holm
over the metrics tested), and the CLI on the real store."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dashboards.compare import (
    NOT_ENOUGH,
    RANK_TEST,
    Estimate,
    as_dict,
    compare,
    estimate,
    judge,
    split_by,
)
from tasks.runtime.errors import UserError
from tasks.tracking.reader import StoredRun, get_stored_run, search_runs

THROUGHPUT = ("e2e.predict.rows_per_s", "compute.steady_rows_per_s")


def _rows(c):
    return {r.key: r for r in c.rows}


@pytest.mark.slow
def test_one_run_a_side_shows_the_ratio_of_batch_16_vs_512_but_claims_nothing(bench_runs):
    base = get_stored_run(bench_runs.a_512, bench_runs.uri)
    cand = get_stored_run(bench_runs.c_16, bench_runs.uri)
    # 4 passes: pass 0 (the first call) is left out of the repeat statistics
    assert base.metrics["run.repeats_measured"] == 3
    c = compare([base], [cand])
    steady = _rows(c)["compute.steady_rows_per_s"]
    # the ratio is shown (candidate over baseline), however large; how large batch 16 is
    # against 512 is the host's business (0.83x on one AVX-512 VM, under 0.67x on others),
    # and no size of it is claimed from one run a side
    # and a run with repeats is read at the median of its passes 1..N-1
    key = "compute.steady_rows_per_s.median"
    assert steady.ratio == pytest.approx(cand.metrics[key] / base.metrics[key])
    assert (steady.method, steady.marked, steady.verdict) == (NOT_ENOUGH, False, NOT_ENOUGH)
    assert any("cannot judge significance" in n for n in c.notes), c.notes
    assert {d.key: (d.baseline, d.candidate) for d in c.param_differences}["run.batch_size"] == ("512", "16")


@pytest.mark.slow
def test_two_runs_of_one_configuration_are_not_flagged(bench_runs):
    # Failed (intermittently, under load) before: in-process pass intervals of two runs of one
    # configuration did not overlap, and compare marked the difference.
    a = get_stored_run(bench_runs.a_512, bench_runs.uri)
    b = get_stored_run(bench_runs.b_512, bench_runs.uri)
    c = compare([a], [b])
    rows = _rows(c)
    assert all(rows[k].method == NOT_ENOUGH for k in THROUGHPUT)
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
    assert "compute.steady_rows_per_s" in res.output and "run.batch_size" in res.output, res.output
    assert "cannot judge significance" in res.output
    data = json.loads((bench_runs.folder / "cmp.json").read_text())
    assert (data["baseline_independent_runs"], data["candidate_independent_runs"]) == (1, 1)
    assert not any(m["marked"] for m in data["metrics"] if m["key"] == "compute.steady_rows_per_s")

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


def _record(run_id: str, metrics: dict, tags: dict | None = None) -> StoredRun:
    return StoredRun(run_id, "r", "e", "FINISHED", 0, 1, metrics, {}, tags or {})


def _group(prefix: str, **series: list[float]) -> list[StoredRun]:
    n = len(next(iter(series.values())))
    return [_record(f"{prefix}{i}", {k.replace("__", "."): v[i] for k, v in series.items()}) for i in range(n)]


def test_disjoint_in_process_intervals_of_single_runs_are_not_significance():
    # Failed before: two runs whose pass intervals (98-102 vs 49-51) did not overlap were marked.
    a = _record(
        "a",
        {
            "e2e.predict.rows_per_s": 100.0,
            "e2e.predict.rows_per_s.median": 100.0,
            "e2e.predict.rows_per_s.median_ci_low": 98.0,
            "e2e.predict.rows_per_s.median_ci_high": 102.0,
            "run.repeats_measured": 8.0,
        },
    )
    b = _record(
        "b",
        {
            "e2e.predict.rows_per_s": 50.0,
            "e2e.predict.rows_per_s.median": 50.0,
            "e2e.predict.rows_per_s.median_ci_low": 49.0,
            "e2e.predict.rows_per_s.median_ci_high": 51.0,
            "run.repeats_measured": 8.0,
        },
    )
    c = compare([a], [b])
    row = _rows(c)["e2e.predict.rows_per_s"]
    assert row.ratio == 0.5
    assert (row.method, row.significant, row.marked, row.verdict) == (NOT_ENOUGH, False, False, NOT_ENOUGH)
    assert row.baseline.has_interval  # shown, for information
    assert any("1 vs 1 independent run(s)" in n and "noise" in n for n in c.notes), c.notes
    data = as_dict(c)
    assert (data["baseline_independent_runs"], data["candidate_independent_runs"]) == (1, 1)


def test_single_values_are_not_enough_independent_runs():
    row = judge("stage.compute.predict.seconds", -1, est(10.0), est(20.0), threshold=0.05, alpha=0.05)
    assert (row.method, row.marked, row.verdict) == (NOT_ENOUGH, False, NOT_ENOUGH)


def test_groups_use_the_rank_test():
    a = est(100, samples=[99, 100, 101, 102, 98])
    b = est(130, samples=[129, 131, 130, 128, 132])
    row = judge("compute.steady_rows_per_s", +1, a, b, threshold=0.05, alpha=0.05)
    assert row.method == RANK_TEST and row.p_value < 0.05
    assert (row.marked, row.verdict) == (True, "improvement")
    same = judge(
        "compute.steady_rows_per_s", +1, a, est(100, samples=[100, 99, 101, 102, 98]), threshold=0.05, alpha=0.05
    )
    assert not same.marked


BASE4 = [100.0, 101.0, 99.0, 100.5]
CAND4 = [130.0, 131.0, 129.0, 130.5]


def test_one_metric_tested_at_4_vs_4_is_marked():
    # the smallest possible two-sided p at 4 vs 4 is 2/70 = 0.0286 < 0.05: alone, it marks
    c = compare(_group("a", e2e__predict__rows_per_s=BASE4), _group("b", e2e__predict__rows_per_s=CAND4))
    row = _rows(c)["e2e.predict.rows_per_s"]
    assert row.p_value == pytest.approx(2 / 70)
    assert row.p_holm == pytest.approx(2 / 70)
    assert (row.marked, row.verdict) == (True, "improvement")


def test_two_metrics_at_4_vs_4_cannot_be_marked_after_holm():
    # Each metric alone has p = 2/70 = 0.0286, but two tests at once need the smaller below
    # 0.025 (Holm's first step), which no outcome of 4 runs a side can give: "not enough runs",
    # never "within noise" (which claims a test that could have found something).
    base = _group("a", e2e__predict__rows_per_s=BASE4, compute__steady_rows_per_s=BASE4)
    cand = _group("b", e2e__predict__rows_per_s=CAND4, compute__steady_rows_per_s=CAND4)
    c = compare(base, cand)
    rows = _rows(c)
    for key in THROUGHPUT:
        assert rows[key].p_value == pytest.approx(2 / 70)
        assert rows[key].p_holm == pytest.approx(4 / 70)
        assert (rows[key].method, rows[key].marked, rows[key].verdict) == (NOT_ENOUGH, False, "not enough runs")
    assert any("0.0286, times 2 tested metric(s)" in n for n in c.notes), c.notes
    data = as_dict(c)
    assert data["correction"] == "holm" and (data["baseline_independent_runs"], data["candidate_independent_runs"]) == (
        4,
        4,
    )
    assert data["tested_metrics"] == 2
    assert {m["key"]: m["baseline_runs"] for m in data["metrics"]}["compute.steady_rows_per_s"] == 4


def test_tied_runs_are_judged_by_the_exact_rank_test():
    # Failed before: with ties, the rank test fell back to the normal approximation, p = 0.032
    # here, and marked a 4 vs 4 difference; over the 70 equally likely splits of these eight
    # values, 4 are as extreme: p = 4/70 = 0.057, not significant.
    base = _group("a", e2e__predict__rows_per_s=[100.0, 100.0, 100.0, 110.0])
    cand = _group("b", e2e__predict__rows_per_s=[110.0, 120.0, 120.0, 120.0])
    row = _rows(compare(base, cand))["e2e.predict.rows_per_s"]
    assert row.p_value == pytest.approx(4 / 70)
    assert (row.marked, row.verdict) == (False, "within noise")


def test_six_runs_a_side_survive_holm_over_two_metrics():
    base6 = [*BASE4, 100.2, 99.8]
    cand6 = [*CAND4, 130.2, 129.8]
    c = compare(
        _group("a", e2e__predict__rows_per_s=base6, compute__steady_rows_per_s=base6),
        _group("b", e2e__predict__rows_per_s=cand6, compute__steady_rows_per_s=cand6),
    )
    assert {r.key for r in c.marked} == set(THROUGHPUT)
    assert all(r.p_holm == pytest.approx(2 * 2 / 924) for r in c.marked)


def test_a_run_value_is_its_repeat_median_from_pass_1():
    from tasks.measure.records import OfflineReport

    # pass 0 carries the first call: 10x slower; the median must not see it
    r = OfflineReport(rows_per_s=(10.0, 100.0, 102.0, 98.0), steady_rows_per_s=(10.0, 200.0, 204.0, 196.0))
    m = r.repeat_metrics()
    assert m["e2e.predict.rows_per_s.median"] == 100.0
    assert m["compute.steady_rows_per_s.median"] == 200.0
    assert m["run.repeats_measured"] == 3


def test_group_intervals_need_six_runs():
    three = [_record(str(i), {"e2e.predict.rows_per_s": v}) for i, v in enumerate([9.0, 10.0, 11.0])]
    assert not estimate(three, "e2e.predict.rows_per_s").has_interval
    six = [_record(str(i), {"e2e.predict.rows_per_s": float(v)}) for i, v in enumerate(range(6))]
    e = estimate(six, "e2e.predict.rows_per_s")
    assert e.has_interval and (e.low, e.high) == (0.0, 5.0)


def test_equal_medians_are_not_enough_runs_where_nothing_could_be_judged():
    # Failed before: equal medians read "same" before compare asked whether these runs could
    # judge anything: 3 vs 3 (whose smallest p, 2/20, never reaches 0.05) and one run a side.
    three = compare(
        _group("a", e2e__predict__rows_per_s=[90.0, 100.0, 110.0]),
        _group("b", e2e__predict__rows_per_s=[80.0, 100.0, 120.0]),
    )
    row = _rows(three)["e2e.predict.rows_per_s"]
    assert (row.ratio, row.method, row.verdict, row.marked) == (1.0, NOT_ENOUGH, NOT_ENOUGH, False)
    one = compare(_group("a", e2e__predict__rows_per_s=[100.0]), _group("b", e2e__predict__rows_per_s=[100.0]))
    assert _rows(one)["e2e.predict.rows_per_s"].verdict == NOT_ENOUGH
    # where the runs can judge, equal medians are "same", by the rank test that ran
    six = compare(
        _group("a", e2e__predict__rows_per_s=[97.0, 98.0, 99.0, 101.0, 102.0, 103.0]),
        _group("b", e2e__predict__rows_per_s=[96.0, 98.5, 99.5, 100.5, 101.5, 104.0]),
    )
    row = _rows(six)["e2e.predict.rows_per_s"]
    assert (row.ratio, row.method, row.verdict, row.marked) == (1.0, RANK_TEST, "same", False)
    assert row.p_value is not None and row.p_value > 0.5


# Six figures with run-to-run noise, 30% better in every candidate run, and two figures every
# run logs at one value: the majority-class rate (fixed by the data) and a stage that does not
# run (calibration off: 0 s in every run, by construction).
NOISY = (
    "e2e.predict.rows_per_s",
    "compute.steady_rows_per_s",
    "compute.first_call_seconds",
    "stage.retrieve.predict.seconds",
    "stage.compute.predict.seconds",
    "memory.host_peak_bytes",
)
FIVE = [1.0, 1.01, 0.99, 1.005, 0.995]


def _constant_group(prefix: str, speedup: float) -> list[StoredRun]:
    runs = []
    for i, n in enumerate(FIVE):
        m = {k: (100.0 * n * speedup if k.endswith("rows_per_s") else 2.0 * n / speedup) for k in NOISY}
        m |= {"quality.majority_rate": 0.6, "stage.calibrate.predict.seconds": 0.0}
        runs.append(_record(f"{prefix}{i}", m))
    return runs


def test_data_constants_and_one_value_metrics_stay_out_of_holms_family():
    # Failed before: both constants counted in Holm's family (8 metrics), and 5 runs a side
    # reach Holm's first step for 6 metrics only (2/252 x 6 = 0.048; x 8 = 0.063): "not enough
    # runs" on every row, though neither constant can ever give a p below 1.
    from dashboards.compare import family_of_group

    base, cand = _constant_group("a", 1.0), _constant_group("b", 1.3)
    c = compare(base, cand)
    rows = _rows(c)
    assert c.tested_metrics == len(NOISY) == 6
    assert {r.key for r in c.marked} == set(NOISY)
    assert all(rows[k].verdict == "improvement" and rows[k].p_holm == pytest.approx(6 * 2 / 252) for k in NOISY)
    majority = rows["quality.majority_rate"]
    assert (majority.method, majority.verdict, majority.p_value, majority.marked) == ("data", "same", None, False)
    calibrate = rows["stage.calibrate.predict.seconds"]
    assert (calibrate.method, calibrate.verdict, calibrate.p_value) == ("exact", "same", None)
    # relflow-bench noise sizes its MDE's family the same way
    assert sorted(family_of_group([r.metrics for r in base])) == sorted(NOISY)
    # a data constant is never marked, even where it differs (the two sides scored other rows)
    other = [_record(r.run_id, {**r.metrics, "quality.majority_rate": 0.7}) for r in cand]
    row = _rows(compare(base, other))["quality.majority_rate"]
    assert (row.verdict, row.marked) == ("data differs", False)
