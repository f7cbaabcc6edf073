"""``compare`` and ``history`` on a real MLflow store written by hand: parents of
``relflow-bench noise`` stand for their child runs, and INVALID runs never make a history step.

Named ``test_compare_store.py`` (tests/README.md): test_compare.py holds compare's own unit tests;
this file is one aspect (compare and history on a real MLflow store)."""

from __future__ import annotations

import json
import math

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from flows.cli.app import app

pytestmark = pytest.mark.slow  # a real MLflow SQLite store per test (migrations take seconds)


@pytest.fixture()
def store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return uri, MlflowClient(uri), tmp_path


def _run(client: MlflowClient, exp: str, metrics: dict[str, float], tags: dict[str, str], start_ms: int) -> str:
    run = client.create_run(exp, start_time=start_ms, tags=tags)
    client.log_batch(run.info.run_id, metrics=[Metric(k, v, start_ms, 0) for k, v in metrics.items()])
    client.set_terminated(run.info.run_id, "FINISHED", end_time=start_ms + 1000)
    return run.info.run_id


# What a real predict-mode child of ``relflow-bench noise`` logs among compare's key metrics:
# ten figures with run-to-run noise (a rank test each, Holm over all ten) and one count fixed
# by the spec and data. A child with one metric made Holm's family 1, where real ones make it
# 10: 4 runs a side then look enough when they are not.
FASTER = ("e2e.predict.rows_per_s", "compute.steady_rows_per_s")  # higher is better
SLOWER = (  # seconds and bytes: lower is better
    "compute.first_call_seconds",
    *(f"stage.{s}.predict.seconds" for s in ("retrieve", "preprocess", "tensorize", "compute", "calibrate", "write")),
    "memory.host_peak_bytes",
)
TESTED = len(FASTER) + len(SLOWER)  # 10
NOISE = [1.0, 1.01, 0.99, 1.005, 0.995, 1.002]  # run-to-run spread, under 1%


def _child_metrics(noise: float, speedup: float) -> dict[str, float]:
    m = {k: 100.0 * noise * speedup for k in FASTER}
    m.update({k: 2.0 * noise / speedup for k in SLOWER})
    m["output.bytes_per_row"] = 24.0  # exact: not tested
    return m


def _noise_parent(client: MlflowClient, exp: str, runs: int, speedup: float) -> str:
    parent = _run(client, exp, {"noise.runs": float(runs)}, {"relflow.report": "noise"}, 1_700_000_000_000)
    for i in range(runs):
        tags = {"mlflow.parentRunId": parent, "relflow.noise_run": str(i)}
        _run(client, exp, _child_metrics(NOISE[i], speedup), tags, 1_700_000_000_000 + i)
    return parent


def _runs_needed_by_hand(family: int) -> int:
    """Fewest runs a side whose smallest two-sided rank-test p, 2 / C(2n, n) (complete
    separation), times the family is below 0.05."""
    n = 2
    while family * 2 / math.comb(2 * n, n) >= 0.05:
        n += 1
    return n


def test_compare_two_noise_parents_tests_their_children_over_the_metrics_they_log(store):
    uri, client, folder = store
    exp = client.create_experiment("exp")
    env = {"MLFLOW_TRACKING_URI": uri, "COLUMNS": "220"}
    assert _runs_needed_by_hand(TESTED) == 6  # 2/252 x 10 = 0.079 at 5 a side; 2/924 x 10 = 0.022 at 6

    # 4 vs 4, every child 30% better on every figure: 2/70 x 10 metrics is 0.29, so nothing
    # can be marked, and compare says so instead of "improvement" or "within noise"
    four = [_noise_parent(client, exp, 4, speedup) for speedup in (1.0, 1.3)]
    res = CliRunner().invoke(app, ["compare", *four, "--json", str(folder / "c4.json")], env=env)
    assert res.exit_code == 0, res.output
    assert "4 vs 4 independent runs" in res.output and "(4 runs)" in res.output
    data = json.loads((folder / "c4.json").read_text())
    assert (data["baseline_independent_runs"], data["candidate_independent_runs"]) == (4, 4)
    assert data["tested_metrics"] == TESTED
    rows = {m["key"]: m for m in data["metrics"]}
    assert set(rows) == {*FASTER, *SLOWER, "output.bytes_per_row"}
    for key in (*FASTER, *SLOWER):
        assert (rows[key]["verdict"], rows[key]["marked"], rows[key]["mde"]) == ("not enough runs", False, None), key
        assert rows[key]["p_value"] == pytest.approx(2 / 70)
    assert any("6 runs a side can" in n for n in data["notes"]), data["notes"]

    # 6 vs 6: the same change is marked on all ten, each p 2/924 Holm-adjusted over ten
    six = [_noise_parent(client, exp, 6, speedup) for speedup in (1.0, 1.3)]
    res = CliRunner().invoke(app, ["compare", *six, "--json", str(folder / "c6.json")], env=env)
    assert res.exit_code == 0, res.output
    data = json.loads((folder / "c6.json").read_text())
    assert data["tested_metrics"] == TESTED
    rows = {m["key"]: m for m in data["metrics"]}
    for key in (*FASTER, *SLOWER):
        assert (rows[key]["verdict"], rows[key]["marked"]) == ("improvement", True), key
        assert rows[key]["p_value"] == pytest.approx(2 / 924)
        assert rows[key]["p_holm"] == pytest.approx(TESTED * 2 / 924)
    assert rows["e2e.predict.rows_per_s"]["ratio"] == pytest.approx(1.3)
    assert rows["stage.compute.predict.seconds"]["ratio"] == pytest.approx(1 / 1.3)
    assert rows["output.bytes_per_row"]["verdict"] != "improvement"  # exact and unchanged

    # a parent with no benchmark children is a clear error, exit 2
    empty = _run(client, exp, {}, {"relflow.report": "noise"}, 1_700_000_000_000)
    res = CliRunner().invoke(app, ["compare", empty, six[1]], env=env)
    assert res.exit_code == 2 and "no FINISHED benchmark child runs" in res.output


def test_history_leaves_invalid_runs_out_and_says_how_many(store):
    uri, client, _ = store
    exp = client.create_experiment("exp")
    # six valid runs at ~100, then four INVALID runs (a busy host) at ~80: counted, they would
    # be a regression step; left out, there is none
    for i, v in enumerate([100, 101, 99, 100, 102, 100, 80, 81, 79, 80]):
        tags = {"relflow.host_fingerprint": "h", "relflow.spec_hash": "s"}
        if i >= 6:
            tags["relflow.validity"] = "INVALID"
        _run(client, exp, {"e2e.predict.rows_per_s": float(v)}, tags, 1_700_000_000_000 + i * 60_000)
    res = CliRunner().invoke(
        app, ["history", "exp", "--fail-on-regression"], env={"MLFLOW_TRACKING_URI": uri, "COLUMNS": "200"}
    )
    assert res.exit_code == 0, res.output
    assert "left out 4 INVALID run(s)" in res.output
    assert "6 FINISHED runs" in res.output and "no steps detected" in res.output


def test_history_of_only_invalid_runs_says_so_and_finds_no_step(store):
    """Four runs at once on a 2-core host are all INVALID: history says it left them out and
    exits 0 (it said "no FINISHED benchmark runs" and exited 2, which the four-host tracking
    test hit whenever the latest run's spec hash had only an INVALID run)."""
    uri, client, _ = store
    exp = client.create_experiment("busy")
    for i, v in enumerate([100, 50, 100, 50]):
        tags = {"relflow.host_fingerprint": "h", "relflow.spec_hash": "s", "relflow.validity": "INVALID"}
        _run(client, exp, {"e2e.predict.rows_per_s": float(v)}, tags, 1_700_000_000_000 + i * 60_000)
    res = CliRunner().invoke(
        app, ["history", "busy", "--fail-on-regression"], env={"MLFLOW_TRACKING_URI": uri, "COLUMNS": "200"}
    )
    assert res.exit_code == 0, res.output
    assert "0 FINISHED runs" in res.output and "none VALID" in res.output
    assert "left out 4 INVALID run(s)" in res.output and "no steps detected" in res.output
    res = CliRunner().invoke(app, ["history", "nothing-here"], env={"MLFLOW_TRACKING_URI": uri, "COLUMNS": "200"})
    assert res.exit_code == 2 and "no FINISHED benchmark runs" in res.output
