"""The ``sweep`` flow: a 2x2x1 grid (three axes, four configurations: the product of two
values on two axes and a single-valued third; the 2x2x2 grid's eight fresh-process children
cost 78 s of a 24-minute suite and proved nothing four do not) at TPC-H scale 0.01 under one
parent MLflow run, resumed
through the real CLI (every configuration skipped), and failing configurations recorded
FAILED while the sweep goes on. Also the Prefect stage-table artifact of a real run.

The base spec is the default workload in predict mode with a tiny model (untrained weights:
a speed run, ~5-10 s per configuration on a busy 2-core machine).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from tasks.runtime.errors import UserError
from tasks.spec import load_spec
from tests.repo import REPO

DEFAULT_SPEC = REPO / "benchmarks" / "tpch_orders.yaml"
BASE = [
    "model.d_model=8",
    "model.heads=2",
    "model.layers=1",
    "run.mode=predict",
    "run.device=cpu",
    "run.min_steady_batches=1",
    "run.min_steady_seconds=0.000001",
]
GRID = {"run.batch_size": [1024, 2048], "run.packing": ["auto", "off"], "lineitem.max_length": [2]}
CLI_GRID = ["--grid", "run.batch_size=1024,2048", "--grid", "run.packing=auto,off", "--grid", "lineitem.max_length=2"]


def _children(uri: str, parent: str):
    client = MlflowClient(tracking_uri=uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(exps, filter_string=f"tags.\"mlflow.parentRunId\" = '{parent}'")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("sweep")
    return folder, f"sqlite:///{folder / 'mlflow.db'}"


@pytest.fixture(scope="module")
def swept(prefect_harness, tpch_small, store):
    """The 2x2x1 sweep, run once in-process: (summary, folder, uri)."""
    from flows.sweeps.grid import sweep

    folder, uri = store
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        base = load_spec(DEFAULT_SPEC, BASE)
        summary = sweep(base_spec=base.to_dict(), grid=GRID, spec_dir=str(DEFAULT_SPEC.parent))
    return summary, folder, uri


@pytest.mark.slow
def test_sweep_makes_one_parent_with_four_tagged_children(swept):
    summary, _, uri = swept
    assert not summary["reused_parent"]
    assert [r["status"] for r in summary["rows"]] == ["FINISHED"] * 4
    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(summary["parent_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["relflow.sweep_hash"] == summary["sweep_hash"]
    children = _children(uri, summary["parent_run_id"])
    assert len(children) == 4 and all(c.info.status == "FINISHED" for c in children)
    swept_values = {
        (
            c.data.tags["relflow.sweep.run.batch_size"],
            c.data.tags["relflow.sweep.run.packing"],
            c.data.tags["relflow.sweep.lineitem.max_length"],
        )
        for c in children
    }
    assert swept_values == {(b, p, m) for b in ("1024", "2048") for p in ("auto", "off") for m in ("2",)}
    for c in children:  # the tag says what the run really used
        assert c.data.params["run.batch_size"] == c.data.tags["relflow.sweep.run.batch_size"]
        assert c.data.params["schema.branches.lineitem.max_length"] == c.data.tags["relflow.sweep.lineitem.max_length"]
    assert len({c.data.tags["relflow.spec_hash"] for c in children}) == 4
    # one configuration at a time: timed regions never overlap
    spans = sorted(
        (c.data.metrics["harness.timed_region_start_unix_s"], c.data.metrics["harness.timed_region_end_unix_s"])
        for c in children
    )
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), spans


@pytest.mark.slow
def test_rerun_through_cli_skips_all_four(swept):
    summary, folder, uri = swept
    args = [sys.executable, "-m", "flows.cli", "sweep", str(DEFAULT_SPEC), *CLI_GRID]
    for o in BASE:
        args += ["--set", o]
    proc = subprocess.run(
        args, cwd=folder, env=dict(os.environ, MLFLOW_TRACKING_URI=uri), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming sweep {summary['sweep_hash']}" in proc.stderr
    assert proc.stderr.count("skipped, already FINISHED") == 4, proc.stderr
    assert "0 ran, 4 skipped" in proc.stdout
    for row in summary["rows"]:
        assert row["run_id"] in proc.stdout  # the table lists every child run id
    assert len(_children(uri, summary["parent_run_id"])) == 4  # no new child runs
    parent = MlflowClient(tracking_uri=uri).get_run(summary["parent_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.tags["relflow.sweep.skipped"] == "4"


@pytest.mark.slow
def test_failing_configurations_are_failed_and_the_sweep_continues(prefect_harness, tpch_small, tmp_path, monkeypatch):
    from flows.sweeps.grid import sweep

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    base = load_spec(DEFAULT_SPEC, [*BASE, "run.batch_size=2048", "lineitem.max_length=2"])
    # overflow=error fails inside the run (orders have up to 7 lines); a missing checkpoint
    # fails before the benchmark flow starts its MLflow run.
    grid = {"run.checkpoint": [None, str(tmp_path / "missing.ckpt")], "lineitem.overflow": ["error", "keep_first"]}
    summary = sweep(base_spec=base.to_dict(), grid=grid, spec_dir=str(DEFAULT_SPEC.parent))
    status = {r["config"]: r["status"] for r in summary["rows"]}
    assert status == {
        "checkpoint=None overflow=error": "FAILED",
        "checkpoint=None overflow=keep_first": "FINISHED",
        f"checkpoint={tmp_path / 'missing.ckpt'} overflow=error": "FAILED",
        f"checkpoint={tmp_path / 'missing.ckpt'} overflow=keep_first": "FAILED",
    }
    children = {c.info.run_id: c for c in _children(uri, summary["parent_run_id"])}
    assert len(children) == 4
    for r in summary["rows"]:
        run = children[r["run_id"]]
        assert run.info.status == r["status"]
        if r["status"] == "FAILED":
            assert r["error"] and run.data.tags["relflow.error"]
    parent = MlflowClient(tracking_uri=uri).get_run(summary["parent_run_id"])
    assert parent.data.tags["relflow.sweep.failed"] == "3"


def test_grid_errors_name_the_key_before_any_work():
    from flows.sweeps.grid import expand

    base = load_spec(DEFAULT_SPEC, BASE)
    with pytest.raises(UserError, match="nosuch"):
        expand(base, {"nosuch.key": [1, 2]})
    with pytest.raises(UserError, match="run.batch_size"):
        expand(base, {"run.batch_size": [64, 0]})
    with pytest.raises(UserError, match="repeats a configuration"):
        expand(base, {"run.packing": ["off", False]})  # YAML's bare off is the same value
    with pytest.raises(UserError, match="non-empty"):
        expand(base, {"run.batch_size": []})


def test_sweep_hash_ignores_order_but_not_values():
    from flows.sweeps.grid import expand, sweep_hash

    base = load_spec(DEFAULT_SPEC, BASE)
    a = sweep_hash(base, expand(base, {"run.batch_size": [64, 256], "run.packing": ["auto", "off"]}))
    b = sweep_hash(base, expand(base, {"run.packing": ["off", "auto"], "run.batch_size": [256, 64]}))
    c = sweep_hash(base, expand(base, {"run.batch_size": [64, 512], "run.packing": ["auto", "off"]}))
    other_base = load_spec(DEFAULT_SPEC, [*BASE, "model.d_model=16"])
    d = sweep_hash(other_base, expand(other_base, {"run.batch_size": [64, 256], "run.packing": ["auto", "off"]}))
    assert a == b and len({a, c, d}) == 3


def test_sweep_section_in_spec_file(tmp_path):
    import yaml

    from tasks.spec.sections import load_spec_and_sections

    raw = yaml.safe_load(DEFAULT_SPEC.read_text())
    raw["sweep"] = {"grid": {"run.batch_size": [64, 256]}}
    raw["schedule"] = {"cron": "0 3 * * *"}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    spec, sections = load_spec_and_sections(path)
    assert sections.sweep.grid == {"run.batch_size": [64, 256]}
    assert sections.schedule.cron == "0 3 * * *" and sections.schedule.timezone == "UTC"
    assert spec.spec_hash == load_spec(DEFAULT_SPEC).spec_hash  # harness sections are not the workload
    raw["sweep"] = {"grid": {"run.batch_size": [64]}, "gird": {}}
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(UserError, match="sweep.gird"):
        load_spec_and_sections(path)


@pytest.mark.slow
def test_stage_table_artifact_names_the_mlflow_run(swept):
    """``publish_run_artifact`` on a real run's summary, inside a flow, read back from Prefect."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.artifacts import artifact_key, publish_run_artifact

    summary, _, uri = swept
    run_id = summary["rows"][0]["run_id"]
    run = MlflowClient(tracking_uri=uri).get_run(run_id)
    stages = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/stages.json")
    run_summary = {
        "run_id": run_id,
        "experiment": "tpch-orders",
        "experiment_id": run.info.experiment_id,
        "tracking_uri": uri,
        "metrics": run.data.metrics,
        "stages": stages,
        "validity": run.data.tags["relflow.validity"],
        "invalid_reasons": [],
    }

    @flow
    def publish(s: dict) -> str:
        return str(publish_run_artifact(s))

    artifact_id = publish(run_summary)
    assert artifact_id != "None"
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[artifact_key("tpch-orders")]))
        )
    mine = [a for a in found if str(a.id) == artifact_id]
    assert mine and mine[0].type == "table" and run_id in mine[0].description
    for stage in ("retrieve", "preprocess", "tensorize", "compute", "write", "end-to-end"):
        assert stage in str(mine[0].data)
