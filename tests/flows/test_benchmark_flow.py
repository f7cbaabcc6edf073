"""The ``benchmark`` flow end to end under the session's Prefect harness, against a temp
MLflow store: every public metric key, params, the spec artifact, tags, and exact row counts.

Runs the default TPC-H workload at scale 0.01 (15,000 orders, 60,175 line items) with a tiny
model and two chunks, so chunked accounting is exercised too. Slow: ~15 s of Prefect start-up
(shared with other flow tests) plus the run.
"""

from __future__ import annotations

from pathlib import Path

import mlflow
import polars as pl
import pyarrow.parquet as pq
import pytest
import yaml
from mlflow.tracking import MlflowClient

from tasks.spec import load_spec, parse_spec

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SPEC = REPO / "benchmarks" / "tpch_orders.yaml"
STAGES = ("retrieve", "preprocess", "tensorize", "compute", "write")
SMALL = ["model.d_model=16", "model.layers=1", "model.heads=2", "run.epochs=1",
         "run.batch_size=512", "run.chunk_rows=10000", "run.device=cpu",
         "run.packing=off"]  # the padded path: packed training is several times slower on CPU
REQUIRED_METRICS = [
    *(f"stage.{s}.{m}" for s in STAGES for m in ("seconds", "rows_per_s")),
    "e2e.seconds", "e2e.rows_per_s", "compute.first_call_seconds", "compute.steady_rows_per_s",
    "data.coords_present", "data.coords_reserved", "data.occupancy", "data.overflow_dropped",
    "output.bytes", "quality.accuracy",
]
REQUIRED_TAGS = ["relflow.spec_hash", "relflow.git_sha", "relflow.torch_version", "relflow.device"]


@pytest.fixture(scope="module")
def tpch_run(prefect_harness, tpch_small, tmp_path_factory):
    """One small run of the default workload; returns (summary, run, folder, tracking uri)."""
    from flows.benchmark import benchmark

    folder = tmp_path_factory.mktemp("flow")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)  # ./outputs lands in the temp folder
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        spec = load_spec(DEFAULT_SPEC, SMALL)
        summary = benchmark(spec=spec.to_dict(), spec_dir=str(DEFAULT_SPEC.parent))
    run = MlflowClient(tracking_uri=uri).get_run(summary["run_id"])
    return summary, run, folder, uri


@pytest.mark.slow
def test_run_finishes_with_every_metric_key(tpch_run):
    summary, run, _, _ = tpch_run
    assert run.info.status == "FINISHED"
    metrics = run.data.metrics
    missing = [k for k in REQUIRED_METRICS if k not in metrics]
    assert not missing, missing
    for stage in STAGES:
        assert metrics[f"stage.{stage}.seconds"] > 0
        assert metrics[f"stage.{stage}.rows_per_s"] > 0
    # e2e is the five stages together, as the user pays
    assert metrics["e2e.seconds"] == pytest.approx(
        sum(metrics[f"stage.{s}.seconds"] for s in STAGES), rel=1e-6)
    assert metrics["e2e.rows_per_s"] == pytest.approx(
        metrics["data.rows_predicted"] / metrics["e2e.seconds"], rel=1e-6)
    assert metrics["compute.first_call_seconds"] > 0
    assert metrics["compute.steady_rows_per_s"] > 0
    assert 0.0 <= metrics["quality.accuracy"] <= 1.0
    assert summary["metrics"]["e2e.seconds"] == pytest.approx(metrics["e2e.seconds"])


@pytest.mark.slow
def test_exact_row_and_coordinate_counts(tpch_run, tpch_small):
    _, run, _, _ = tpch_run
    m = run.data.metrics
    orders = pq.ParquetFile(tpch_small / "orders.parquet").metadata.num_rows
    lines = pq.ParquetFile(tpch_small / "lineitem.parquet").metadata.num_rows
    assert orders == 15_000
    assert m["data.rows_predicted"] == orders
    assert m["data.root_rows"] == orders
    assert m["data.chunks"] == 2  # chunk_rows 10,000
    # no order has more than 7 lines, max_length is 8: nothing overflows
    assert m["data.overflow_dropped"] == 0
    # cells: root 3 inputs + the target = 4; lineitem 7 columns x 8 reserved rows
    assert m["data.coords_reserved"] == orders * (4 + 8 * 7)
    assert m["data.coords_present"] == orders * 4 + lines * 7
    assert m["data.occupancy"] == pytest.approx(m["data.coords_present"] / m["data.coords_reserved"])


@pytest.mark.slow
def test_predictions_hold_one_row_per_root_key(tpch_run, tpch_small):
    summary, run, folder, _ = tpch_run
    path = Path(summary["output_path"])
    assert path.is_file() and path.is_relative_to(folder / "outputs")
    assert run.data.tags["relflow.output_path"] == str(path)
    preds = pl.read_parquet(path)
    assert preds.columns == ["o_orderkey", "prediction"]
    keys = pl.read_parquet(tpch_small / "orders.parquet", columns=["o_orderkey"])["o_orderkey"]
    assert preds.height == keys.len() == run.data.metrics["data.rows_predicted"]
    assert preds["o_orderkey"].n_unique() == preds.height
    assert set(preds["o_orderkey"].to_list()) == set(keys.to_list())
    assert set(preds["prediction"].unique().to_list()) <= {"F", "O", "P"}
    assert run.data.metrics["output.bytes"] == path.stat().st_size
    # no temp file left beside it
    assert not [p.name for p in path.parent.iterdir() if ".tmp-" in p.name]


@pytest.mark.slow
def test_params_tags_and_artifacts(tpch_run):
    summary, run, _, uri = tpch_run
    params = run.data.params
    assert params["name"] == "tpch-orders"
    assert params["model.d_model"] == "16"
    assert params["run.batch_size"] == "512"
    assert params["schema.root.key"] == "o_orderkey"
    assert params["schema.branches.lineitem.max_length"] == "8"
    assert params["schema.branches.lineitem.order_by.column"] == "l_linenumber"
    assert params["task.target"] == "o_orderstatus"
    tags = run.data.tags
    missing = [t for t in REQUIRED_TAGS if not tags.get(t)]
    assert not missing, missing
    assert tags["relflow.device"] == "cpu"
    assert tags["relflow.torch_version"].startswith("2.")
    artifacts = {a.path for a in MlflowClient(tracking_uri=uri).list_artifacts(run.info.run_id)}
    assert "spec.yaml" in artifacts
    local = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="spec.yaml",
                                                tracking_uri=uri)
    logged = parse_spec(yaml.safe_load(Path(local).read_text()))
    assert logged.spec_hash == tags["relflow.spec_hash"]
    assert logged == load_spec(DEFAULT_SPEC, SMALL)
    assert summary["experiment"] == "tpch-orders"
