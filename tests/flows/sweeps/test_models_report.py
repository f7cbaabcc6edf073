"""The models report: its table and paired ratios from hand-made child records (medians over
VALID rounds only, peak RSS a median, quality.rows shown and quality not compared when they
differ, a RelBench task's own figure beside its stronger baseline), the rotation of order per
round, bad flags (exit 2 before any run), and a child's exit 2 on bad data told apart from a
library's refusal (real messages; slow: a real child exiting on relational-transformers' own
data error)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import yaml

from flows.sweeps.models_report import (
    BUSY_HOST_NOTE,
    DATA_ERROR,
    LIBRARIES,
    REFUSED,
    is_refusal,
    parse_libraries,
    parse_library_sets,
    round_order,
    summarize,
    to_markdown,
)
from tasks.measure.report import RunSummary, Sample


def sample(
    lib: str, r: int, e2e: float, validity: str = "VALID", reasons: tuple[str, ...] = (), **extra: float
) -> Sample:
    m = {
        "e2e.predict.rows_per_s": e2e,
        "compute.steady_rows_per_s": e2e * 4,
        "compute.first_call_seconds": 0.5,
        "compute.batch_ms.p99": 9.0,
        "quality.accuracy": 0.8,
        "quality.majority_rate": 0.6,
        "quality.rows": 100.0,
        "quality.uncalibrated.nll": 0.75,
        "quality.nll": 0.5,
        "memory.host_peak_bytes": 2**30,
        **extra,
    }
    return Sample(lib, r, RunSummary(f"id-{lib}-{r}", m, validity, invalid_reasons=list(reasons)))


def test_half_the_references_rows_per_s_every_round_is_0_5_with_a_0_5_interval():
    samples, params = [], {}
    for r in range(6):
        ref = 100.0 * (r + 1)  # the host drifts; the paired ratio does not
        samples += [sample("reference", r, ref), sample("relflow", r, ref / 2)]
        params[f"id-reference-{r}"], params[f"id-relflow-{r}"] = 1000.0, 250_000.0
    rows = {row["variant"]: row for row in summarize(samples, "category", parameters=params)}
    rf = rows["relflow"]
    assert rf["e2e_vs_reference"] == 0.5
    assert (rf["e2e_vs_reference_ci_low"], rf["e2e_vs_reference_ci_high"]) == (0.5, 0.5)
    assert rf["e2e_vs_reference_rounds"] == 6
    assert rows["reference"]["e2e_vs_reference"] == 1.0
    assert rf["e2e_predict_rows_per_s"] == 175.0  # median of 50..300
    assert rf["parameters"] == 250_000.0 and rf["quality"] == 0.8 and rf["baseline"] == 0.6
    md = to_markdown(list(rows.values()), "category")
    assert "accuracy [95% CI] (majority_rate) | quality.rows |" in md.splitlines()[0]
    assert (
        "| relflow | 0.8000 (0.6000) | 100 | 0.7500 -> 0.5000 | 175 | 0.50x [0.50, 0.50] | 700 | 0.50 | 9.0 "
        "| 1,024 | 250,000 | 6/6 | VALID |" in md
    )
    assert "rounds VALID" not in md and "not compared" not in md  # every round VALID, one set of rows


def test_peak_rss_is_the_median_of_each_runs_peak_not_the_largest():
    """Three rounds peaking at 1, 2 and 10 GiB: the column (headed "median") says 2,048 MiB;
    the largest peak would say 10,240."""
    samples = [
        sample("relflow", r, 10.0, **{"memory.host_peak_bytes": gib * 2**30}) for r, gib in enumerate((1, 10, 2))
    ]
    (row,) = summarize(samples, "category")
    assert row["peak_rss_mib"] == 2048.0
    md = to_markdown([row], "category")
    assert "| peak RSS MiB (median) |" in md.splitlines()[0] and "| 2,048 |" in md


def test_medians_are_over_valid_rounds_only_and_the_table_says_how_many():
    """An INVALID round's figures (here a run on a loaded host: 10x the rows/s, 3x the first
    call, a worse accuracy) stay out of every median, of the paired ratio to the reference, and
    of the parameters; the table counts the VALID rounds and a note names why the others are
    not. The medians of all three rounds would be 200 rows/s, 0.75 accuracy, 1.5 s."""
    busy = ("host busy: other processes used 40% of the cores",)
    samples = [
        sample("reference", 0, 100.0),
        sample("reference", 1, 100.0),
        sample("reference", 2, 100.0),
        sample("relflow", 0, 50.0, **{"quality.accuracy": 0.8, "compute.first_call_seconds": 0.5}),
        sample("relflow", 1, 1000.0, "INVALID", busy, **{"quality.accuracy": 0.2, "compute.first_call_seconds": 6.0}),
        sample("relflow", 2, 200.0, "INVALID", busy, **{"quality.accuracy": 0.75, "compute.first_call_seconds": 1.5}),
    ]
    params = {"id-relflow-0": 1000.0, "id-relflow-1": 9.0, "id-relflow-2": 9.0}
    rows = {r["variant"]: r for r in summarize(samples, "category", parameters=params)}
    rf = rows["relflow"]
    assert rf["e2e_predict_rows_per_s"] == 50.0 and rf["quality"] == 0.8 and rf["first_call_s"] == 0.5
    assert (rf["rounds"], rf["valid_rounds"], rf["validity"]) == (3, 1, "INVALID,VALID")
    assert rf["steady_rows_per_s"] == 200.0 and rf["parameters"] == 1000.0
    assert (rf["e2e_vs_reference"], rf["e2e_vs_reference_rounds"]) == (0.5, 1)  # round 0 alone pairs
    md = to_markdown(list(rows.values()), "category")
    assert "| 3/3 | VALID |" in md and "| 1/3 | INVALID,VALID |" in md
    assert f"Note: relflow: 1 of 3 rounds VALID, its figures are medians over those only (not VALID: {busy[0]})." in md
    # no VALID round at all: no figures, and the note says so
    (row,) = summarize([sample("relflow", 0, 10.0, "INVALID", busy)], "category")
    assert math.isnan(row["quality"]) and math.isnan(row["e2e_predict_rows_per_s"])
    assert "Note: relflow: 0 of 1 rounds VALID, no figures" in to_markdown([row], "category")


def test_quality_is_not_compared_when_the_libraries_scored_different_rows():
    """The same held-out rows or no comparison: a library whose VALID rounds scored other rows
    (quality.rows 98 against 100) gets no quality figure in any row, and a note names the rows."""
    samples = [
        sample("reference", 0, 100.0, **{"quality.rows": 100.0}),
        sample("relflow", 0, 50.0, **{"quality.rows": 98.0}),
        sample("relflow", 1, 50.0, **{"quality.rows": 100.0}),
        sample(
            "relational_transformers", 0, 20.0, "INVALID", ("x",), **{"quality.rows": 7.0}
        ),  # not VALID: not counted
    ]
    rows = summarize(samples, "category")
    assert [r["quality_compared"] for r in rows] == [False, False, False]
    md = to_markdown(rows, "category")
    assert "| reference | not compared: quality.rows differ | 100 |" in md
    assert "| relflow | not compared: quality.rows differ | 99 |" in md
    assert "quality.rows: reference 100; relflow 98-100; relational_transformers -)" in md
    same = summarize([s for s in samples if s.variant != "relflow"], "category")
    assert [r["quality_compared"] for r in same] == [True, True]
    assert "not compared" not in to_markdown(same, "category")


@pytest.mark.parametrize(
    ("kind", "metric", "figure", "ci", "baselines", "stronger"),
    [
        ("binary", "roc_auc", 0.74, (0.70, 0.78), {"train_mean": 0.5, "previous": 0.62}, ("previous", 0.62)),
        ("regression", "nmae", 0.81, (0.75, 0.88), {"train_mean": 0.93, "previous": 1.20}, ("train_mean", 0.93)),
    ],
)
def test_a_relbench_task_shows_relbenchs_figure_beside_its_stronger_baseline(
    kind, metric, figure, ci, baselines, stronger
):
    """A RelBench task's quality cell is ``relbench.<metric>`` with its interval, beside the
    stronger of the training-mean and previous-label baselines (the higher AUC, the lower NMAE),
    not the harness's accuracy and majority rate."""
    m = {f"relbench.{metric}": figure, f"relbench.{metric}.ci_low": ci[0], f"relbench.{metric}.ci_high": ci[1]}
    m |= {f"quality.baseline.{b}.{metric}": v for b, v in baselines.items()}
    (row,) = summarize([sample("reference", 0, 10.0, **m)], kind, relbench=True)
    assert (row["quality"], row["quality_ci_low"], row["quality_ci_high"]) == (figure, *ci)
    assert (row["baseline_name"], row["baseline"]) == stronger
    md = to_markdown([row], kind, relbench=True)
    assert f"relbench.{metric} [95% CI] (stronger baseline) |" in md.splitlines()[0]
    assert f"| reference | {figure:.4f} [{ci[0]:.4f}, {ci[1]:.4f}] ({stronger[0]} {stronger[1]:.4f}) | 100 |" in md
    # the same runs outside a RelBench task show the harness's own headline
    assert "(majority_rate)" in to_markdown(summarize([sample("reference", 0, 10.0, **m)], "binary"), "binary")


def test_the_reports_relbench_metrics_and_directions_are_relbench_scores():
    from flows.sweeps.models_report import RELBENCH_HIGHER_IS_BETTER, RELBENCH_METRIC
    from tasks.run.record.relbench_scores import HIGHER_IS_BETTER

    assert RELBENCH_HIGHER_IS_BETTER == HIGHER_IS_BETTER
    assert set(RELBENCH_METRIC.values()) == set(HIGHER_IS_BETTER)


def test_fewer_than_6_rounds_give_no_interval_and_a_failed_round_pairs_with_nothing():
    samples = [sample("reference", 0, 100.0), sample("relational_transformers", 0, 20.0)]
    samples += [sample("reference", 1, 100.0), Sample("relational_transformers", 1, None)]
    rows = {row["variant"]: row for row in summarize(samples, "regression")}
    rt = rows["relational_transformers"]
    assert rt["e2e_vs_reference"] == 0.2 and rt["e2e_vs_reference_rounds"] == 1
    assert rt["e2e_vs_reference_ci_low"] is None
    assert rt["validity"] == "FAILED,VALID" and math.isnan(rt["parameters"])
    md = to_markdown(list(rows.values()), "regression")
    assert "mae [95% CI] (mae_of_mean)" in md and "0.20x [n=1<6, no CI]" in md
    assert (
        "Note: relational_transformers: 1 of 2 rounds VALID, its figures are medians over those only (1 FAILED)." in md
    )


def test_nll_column_shows_the_rounds_median_raw_and_calibrated_and_a_dash_without_them():
    """The NLL pair is each library's median over its rounds; a run that logs no NLL (regression)
    shows '-', never 'nan -> nan'."""
    samples = [
        sample("relflow", r, 10.0, **{"quality.uncalibrated.nll": raw, "quality.nll": cal})
        for r, (raw, cal) in enumerate([(0.70, 0.69), (0.75, 0.74), (0.90, 0.10)])
    ]
    (row,) = summarize(samples, "category")
    assert (row["nll_uncalibrated"], row["nll"]) == (0.75, 0.69)
    assert "| relflow | 0.8000 (0.6000) | 100 | 0.7500 -> 0.6900 |" in to_markdown([row], "category")
    regression = {"e2e.predict.rows_per_s": 10.0, "quality.mae": 1.5, "quality.mae_of_mean": 3.0}
    (row,) = summarize([Sample("reference", 0, RunSummary("id", regression, "VALID"))], "regression")
    assert "| reference | 1.5000 (3.0000) | - | - | 10 |" in to_markdown([row], "regression")


def test_quality_shows_its_interval_the_median_of_each_bound_over_rounds():
    """Each run logs its headline's bootstrap interval over its test rows; the cell shows the
    median quality and the median of each bound, and no brackets where no run logged one."""
    bounds = [(0.70, 0.80, 0.90), (0.72, 0.79, 0.86), (0.60, 0.84, 0.95)]
    samples = [
        sample("reference", r, 10.0, **{"quality.auc": q, "quality.auc.ci_low": lo, "quality.auc.ci_high": hi})
        for r, (lo, q, hi) in enumerate(bounds)
    ]
    (row,) = summarize(samples, "binary")
    assert (row["quality"], row["quality_ci_low"], row["quality_ci_high"]) == (0.80, 0.70, 0.90)
    md = to_markdown([row], "binary")
    assert "auc [95% CI] (majority_rate)" in md.splitlines()[0]
    assert "| reference | 0.8000 [0.7000, 0.9000] (0.6000) | 100 |" in md
    (plain,) = summarize([sample("relflow", 0, 10.0)], "category")  # no interval logged
    assert math.isnan(plain["quality_ci_low"])
    assert "| relflow | 0.8000 (0.6000) | 100 |" in to_markdown([plain], "category")


def test_a_refused_library_is_a_row_saying_why():
    samples = [sample("reference", 0, 100.0)]
    why = "UserError: model.library relational_transformers cannot run task.kind ...; set X."
    rows = summarize(samples, "category", refused={"relational_transformers": why})
    assert [r["variant"] for r in rows] == ["reference", "relational_transformers"]
    assert rows[1]["validity"] == REFUSED and rows[1]["reason"] == why
    md = to_markdown(rows, "category")
    assert f"| relational_transformers | refused: {why} |" in md and md.split("\n\n")[0].endswith("| 0 | REFUSED |")
    # a library without the reference beside it has no ratio: "-", not a crash
    assert "| - |" in to_markdown(summarize([sample("relflow", 0, 5.0)], "binary"), "binary")


def _rt_spec(shop_spec: dict, **task: object) -> dict:
    raw = {**shop_spec, "task": {**shop_spec["task"], **task}}
    raw["model"] = {"library": "relational_transformers", "d_model": 8, "layers": 2, "heads": 2}
    return raw


def test_a_refusal_is_told_apart_from_a_data_error_by_the_real_messages(shop_spec, shop_tables):
    """The messages the real code raises: a library's check and the harness's refusals are
    refusals; a target whose values do not read as booleans (the data) is not."""
    from tasks.libraries.base import harness_problems
    from tasks.libraries.relational_transformers import build_contexts, check, fit_stats
    from tasks.runtime.errors import UserError
    from tasks.spec import parse_spec
    from tasks.stages.preprocess import preprocess
    from tasks.stages.retrieve import ROOT, Retrieved

    triton = _rt_spec(shop_spec)
    triton["run"] = {**triton["run"], "backend": "triton"}
    with pytest.raises(UserError) as refused:
        check(parse_spec(triton, "(test)"))
    harness = parse_spec({**shop_spec, "run": {**shop_spec["run"], "check_outputs": True}}, "(test)")
    unsupported = harness_problems(harness)[0].message("relflow")
    spec = parse_spec(_rt_spec(shop_spec, kind="binary"), "(test)")  # churn is "yes"/"no": not booleans
    t = shop_tables
    table = preprocess(spec, Retrieved({ROOT: t["customers"], "orders": t["orders"], "lines": t["lines"]}, 0, 5)).table
    with pytest.raises(UserError) as data:
        build_contexts(table, spec, fit_stats(table, spec))
    # as the parent sees a child's exit 2 (flows/sweeps/launch.py child_error)
    assert is_refusal("relational_transformers", f"UserError: {refused.value}")
    assert is_refusal("relflow", f"UserError: {unsupported}")
    assert not is_refusal("relational_transformers", f"UserError: {data.value}")
    assert not is_refusal("relflow", f"UserError: {refused.value}")  # another library's refusal


def test_a_data_error_is_its_own_row_never_refused():
    why = "UserError: task.target 'churn' is binary but its values (string) do not read as booleans"
    rows = summarize([sample("reference", 0, 100.0)], "category", data_errors={"relational_transformers": why})
    assert rows[1]["validity"] == DATA_ERROR and rows[1]["reason"] == why
    md = to_markdown(rows, "category")
    assert f"| relational_transformers | data error: {why} |" in md and md.split("\n\n")[0].endswith(
        "| 0 | DATA ERROR |"
    )
    assert REFUSED not in md


@pytest.mark.slow
def test_a_child_exiting_2_on_its_data_is_reported_as_a_data_error(tmp_path, shop_spec, shop_files):
    """A real models-report over a spec the library's check and the harness's data checks
    accept, and relational-transformers' own encode refuses: a binary target stored as
    "yes"/"no" (validation_fraction 0.3 holds customer 1 out and leaves both values among the
    training rows, so the split check before work passes). The child exits 2 with RT's message,
    and the report shows that message as a data error, never a refusal."""
    spec = shop_files / "spec.yaml"
    raw = _rt_spec(shop_spec, kind="binary", validation_fraction=0.3)
    raw["run"] = {**raw["run"], "system_metrics_interval_s": 0}
    spec.write_text(yaml.safe_dump(raw))
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}", "HF_HUB_OFFLINE": "1"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "models-report", str(spec), "--libraries", "relational_transformers"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = " ".join(proc.stdout.split())  # the console wraps long lines
    assert "| relational_transformers | data error: UserError: task.target 'churn' is binary but its values" in out
    assert "do not read as booleans" in out and "validation split" not in out, out
    assert proc.stdout.rstrip().endswith("| 0 | DATA ERROR |") and REFUSED not in proc.stdout


def test_the_order_rotates_each_round():
    libs = list(LIBRARIES)
    assert libs == ["reference", "relflow", "relational_transformers", "lightgbm"]  # the registry's order
    orders = [round_order(libs, r) for r in range(5)]
    assert orders[0] == libs
    assert orders[1] == ["relflow", "relational_transformers", "lightgbm", "reference"]
    assert orders[2] == ["relational_transformers", "lightgbm", "reference", "relflow"]
    assert orders[4] == orders[0]
    assert [o[0] for o in orders[:4]] == libs  # each library leads one round in four


def test_libraries_flag_parsing():
    assert parse_libraries(None) == list(LIBRARIES)
    assert parse_libraries("relflow, reference") == ["relflow", "reference"]
    for bad, says in (("", "empty"), ("reference,bogus", "bogus"), ("relflow,relflow", "more than once")):
        with pytest.raises(ValueError, match=says):
            parse_libraries(bad)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--libraries", "reference,bogus"], "bogus"),
        (["--rounds", "0"], "--rounds must be at least 1"),
        (["--set", "bogus=1"], "bogus"),
        (["--library-set", "lightgbm"], "LIB:KEY=VALUE"),
        (["--libraries", "reference", "--library-set", "lightgbm:run.repeats=2"], "not a library this report runs"),
        (["--library-set", "lightgbm:run.bogus=1"], "bogus"),
    ],
)
def test_bad_flags_exit_2_before_any_run(args, says, tmp_path, shop_spec):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(shop_spec))
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "models-report", str(spec), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = proc.stderr.splitlines()
    message = " ".join(line for line in lines + proc.stdout.splitlines() if not line.startswith("import time:"))
    assert proc.returncode == 2, message[-2000:]
    assert says in message, message[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in lines if line.startswith("import time:")}
    assert not imported & {"torch", "mlflow", "prefect"}
    assert not (tmp_path / "m.db").exists()


LGB_NOTE = "a tree ensemble: its work is comparisons down trees, not FLOPs (no MFU)"
STAGE_SECONDS = {
    "retrieve": 0.02,
    "preprocess": 0.03,
    "tensorize": 0.06,
    "compute": 0.21,
    "calibrate": 0.0,
    "write": 0.01,
}


def costed(lib: str, r: int, e2e_seconds: float, tags: dict[str, str] | None = None, **extra: float) -> Sample:
    """A round of ``lib`` over 15,000 predictions: its e2e and stage seconds, as a run logs them."""
    rows = 15_000.0
    m = {
        **sample(lib, r, rows / e2e_seconds).metrics,
        "e2e.predict.seconds": e2e_seconds,
        "e2e.predict.rows": rows,
        "e2e.predict.passes": 1.0,
        **{f"stage.{st}.predict.seconds": secs for st, secs in STAGE_SECONDS.items()},
        **extra,
    }
    return Sample(lib, r, RunSummary(f"id-{lib}-{r}", m, "VALID", tags=tags or {}))


def test_the_cost_table_shows_ms_per_prediction_per_stage_and_says_plainly_what_a_library_lacks():
    """LightGBM beside the transformers: its stage costs are figures like theirs, and where it has
    none (no FLOPs so no MFU, no model floors) the cell says so and a note says why, never 0."""
    floors = {"floor.tensorize.fraction": 0.25, "floor.compute.fraction": 0.5}
    samples = []
    for r in range(2):
        samples += [
            costed("reference", r, 3.0, **{"compute.mfu": 0.04}, **floors),
            costed("relational_transformers", r, 20.0, **{"compute.mfu": 0.155, "stage.encode.predict.seconds": 0.036}),
            costed("lightgbm", r, 0.3 + 0.03 * r, {"relflow.flops_note": LGB_NOTE}),
        ]
    rows = {row["variant"]: row for row in summarize(samples, "category")}
    lgb = rows["lightgbm"]
    assert lgb["e2e_ms_per_prediction"] == pytest.approx(1000 * 0.315 / 15_000)  # the median of each run's
    assert lgb["compute_ms_per_prediction"] == pytest.approx(1000 * 0.21 / 15_000)
    assert math.isnan(lgb["encode_ms_per_prediction"]) and math.isnan(lgb["mfu"])
    assert lgb["model_floors"] is False and rows["reference"]["model_floors"] is True
    md = to_markdown(list(rows.values()), "category")
    tables = md.split("\n\n")
    assert tables[1].startswith("Cost per prediction, predict phase")
    cost = tables[2].splitlines()
    assert cost[0] == (
        "| library | e2e ms/pred | retrieve ms/pred | preprocess ms/pred | encode ms/pred | tensorize ms/pred | "
        "compute ms/pred | calibrate ms/pred | write ms/pred | MFU (predict) | tensorize vs floor | compute vs floor |"
    )
    assert (
        "| reference | 0.2000 | 0.0013 | 0.0020 | - | 0.0040 | 0.0140 | 0.0000 | 0.0007 | 4.0% | 25.0% | 50.0% |"
        in cost
    )
    assert (
        "| relational_transformers | 1.3333 | 0.0013 | 0.0020 | 0.0024 | 0.0040 | 0.0140 | 0.0000 | 0.0007 | 15.5% "
        "| none: no model floor | none: no model floor |" in cost
    )
    assert (
        "| lightgbm | 0.0210 | 0.0013 | 0.0020 | - | 0.0040 | 0.0140 | 0.0000 | 0.0007 | none: no FLOPs "
        "| none: no model floor | none: no model floor |" in cost
    )
    assert f"Note: no MFU for lightgbm: {LGB_NOTE}." in md
    assert (
        "Note: the tensorize and compute floors are the reference model's work (its tensors and GEMMs, "
        "Library.model_floors); relational_transformers, lightgbm have none." in md
    )
    # its quality and cost are in the first table as the others' are
    assert "| lightgbm | 0.8000 (0.6000) | 100 | 0.7500 -> 0.5000 | 47,727 | 9.55x [n=2<6, no CI] |" in md


def test_a_missing_figure_without_a_reason_is_a_dash_and_untrusted_floors_are_starred():
    """No MFU and no flops note (a run that logged neither): '-', not "no FLOPs"; floors measured
    on a busy host: the fraction starred and a note with floor_trust's reason. No tensorize
    fraction in runs of one predict pass (no warm figure): said so; with more passes: '-'."""
    busy_floors = {"floor.compute.fraction": 0.5, "floor.other_cpu_fraction": 0.6}
    (row,) = summarize([costed("reference", 0, 3.0, **busy_floors)], "category")
    cost = to_markdown([row], "category").split("\n\n")[2]
    assert cost.splitlines()[2].endswith("| - | none: one pass (no warm figure) | 50.0%* |")
    (three,) = summarize([costed("reference", 0, 3.0, **{"e2e.predict.passes": 3.0})], "category")
    assert to_markdown([three], "category").split("\n\n")[2].splitlines()[2].endswith("| - | - | - |")
    assert "Note: reference's floor fractions (*) stand on untrusted floors: floor.other_cpu_fraction 0.60 > 0.1" in (
        to_markdown([row], "category")
    )


def test_a_librarys_own_overrides_and_its_other_pass_count_are_noted():
    samples = [
        costed("reference", 0, 3.0),
        costed("lightgbm", 0, 4.8, {"relflow.flops_note": LGB_NOTE}, **{"e2e.predict.passes": 16.0}),
    ]
    own = {"lightgbm": ["run.repeats=16", "run.mode=predict"]}
    rows = summarize(samples, "category", library_overrides=own)
    assert rows[1]["overrides"] == ["run.repeats=16", "run.mode=predict"] and rows[0]["overrides"] == []
    md = to_markdown(rows, "category")
    assert (
        "Note: lightgbm ran with overrides of its own after --set (--library-set): run.repeats=16, run.mode=predict."
        in md
    )
    assert (
        "Note: the libraries' runs made different numbers of predict passes "
        "(e2e.predict.passes: reference 1, lightgbm 16)" in md
    )
    # a refused library keeps its overrides in its row and the note
    rows = summarize(samples[:1], "category", refused={"lightgbm": "no"}, library_overrides=own)
    assert rows[1]["overrides"] == own["lightgbm"] and "Note: lightgbm ran with overrides" in to_markdown(
        rows, "category"
    )


def test_library_set_flag_parsing():
    libs = ["reference", "lightgbm"]
    assert parse_library_sets(None, libs) == {}
    got = parse_library_sets(["lightgbm:run.repeats=16", "lightgbm: run.mode=predict", "reference:run.seed=1"], libs)
    assert got == {"lightgbm": ["run.repeats=16", "run.mode=predict"], "reference": ["run.seed=1"]}
    for bad, says in (
        ("lightgbm", "LIB:KEY=VALUE"),
        ("lightgbm:run.repeats", "LIB:KEY=VALUE"),
        ("lightgbm:=3", "LIB:KEY=VALUE"),
        ("relflow:run.repeats=2", "not a library this report runs"),
    ):
        with pytest.raises(ValueError, match=says):
            parse_library_sets([bad], libs)


def test_include_busy_host_counts_rounds_invalid_only_for_the_hosts_load_and_says_so():
    """With --include-busy-host a round INVALID only because other processes used the cores
    counts (its own work was measured); one INVALID for a short steady window as well never
    does. Without the flag neither counts. The rounds stay INVALID in the table."""
    load = "host.other_cpu_fraction_before 0.61 > run.max_host_load 0.5 (other processes used the cores)"
    load_during = "host.other_cpu_fraction 0.52 > run.max_host_load 0.5 (other processes used the cores)"
    window = "compute.steady_seconds 0.118 < run.min_steady_seconds 1.0"
    samples = [
        sample("reference", 0, 100.0),
        sample("reference", 1, 80.0, "INVALID", (load, load_during)),
        sample("lightgbm", 0, 1000.0, "INVALID", (load,)),
        sample("lightgbm", 1, 5000.0, "INVALID", (window, load)),
    ]
    strict = {r["variant"]: r for r in summarize(samples, "category")}
    assert strict["reference"]["e2e_predict_rows_per_s"] == 100.0 and strict["reference"]["busy_rounds_counted"] == 0
    assert math.isnan(strict["lightgbm"]["e2e_predict_rows_per_s"])
    assert BUSY_HOST_NOTE not in to_markdown(list(strict.values()), "category")
    rows = {r["variant"]: r for r in summarize(samples, "category", include_busy_host=True)}
    ref, lgb = rows["reference"], rows["lightgbm"]
    assert ref["e2e_predict_rows_per_s"] == 90.0 and (ref["valid_rounds"], ref["busy_rounds_counted"]) == (1, 1)
    assert lgb["e2e_predict_rows_per_s"] == 1000.0 and (lgb["valid_rounds"], lgb["busy_rounds_counted"]) == (0, 1)
    assert (lgb["e2e_vs_reference"], lgb["e2e_vs_reference_rounds"]) == (10.0, 1)  # round 0 alone counts for both
    md = to_markdown(list(rows.values()), "category")
    assert BUSY_HOST_NOTE in md and "| 0/2 | INVALID |" in md
    assert (
        "Note: lightgbm: 0 of 2 rounds VALID, its figures are medians over those and 1 INVALID only for the host's load"
        in md
    )
