"""``compare`` and ``history`` on a real MLflow store written by hand: parents of
``relflow-bench noise`` stand for their child runs, and INVALID runs never make a history step."""

from __future__ import annotations

import json

import pytest
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
    for k, v in metrics.items():
        client.log_metric(run.info.run_id, k, v)
    client.set_terminated(run.info.run_id, "FINISHED", end_time=start_ms + 1000)
    return run.info.run_id


def test_compare_two_noise_parents_tests_their_children(store):
    uri, client, folder = store
    exp = client.create_experiment("exp")
    parents = []
    for side, values in (("a", [100.0, 101.0, 99.0, 100.5]), ("b", [130.0, 131.0, 129.0, 130.5])):
        parent = _run(client, exp, {"noise.runs": 4.0}, {"relflow.report": "noise"}, 1_700_000_000_000)
        for i, v in enumerate(values):
            _run(
                client,
                exp,
                {"e2e.predict.rows_per_s": v},
                {"mlflow.parentRunId": parent, "relflow.noise_run": str(i), "side": side},
                1_700_000_000_000 + i,
            )
        parents.append(parent)
    env = {"MLFLOW_TRACKING_URI": uri, "COLUMNS": "220"}
    res = CliRunner().invoke(app, ["compare", *parents, "--json", str(folder / "c.json")], env=env)
    assert res.exit_code == 0, res.output
    assert "4 vs 4 independent runs" in res.output and "(4 runs)" in res.output
    data = json.loads((folder / "c.json").read_text())
    assert (data["baseline_independent_runs"], data["candidate_independent_runs"]) == (4, 4)
    (row,) = [m for m in data["metrics"] if m["key"] == "e2e.predict.rows_per_s"]
    assert row["marked"] and row["verdict"] == "improvement"
    assert row["p_holm"] == pytest.approx(2 / 70)  # the one tested metric: Holm is the raw p

    # a parent with no benchmark children is a clear error, exit 2
    empty = _run(client, exp, {}, {"relflow.report": "noise"}, 1_700_000_000_000)
    res = CliRunner().invoke(app, ["compare", empty, parents[1]], env=env)
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
