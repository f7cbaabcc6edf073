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
from tests.golden import check_golden
from tests.repo import REPO, SMALL_RUN

DEFAULT_SPEC = REPO / "benchmarks" / "tpch_orders.yaml"
STAGES = ("retrieve", "preprocess", "tensorize", "compute", "calibrate", "write")
OVERRIDES = [
    *SMALL_RUN,
    "run.chunk_rows=10000",
    "run.packing=off",
    # issue 4: repeated predict passes (CIs) and a validity rule that must fail
    "run.repeats=3",
    "run.min_steady_batches=100000",
]
REQUIRED_METRICS = [
    *(f"stage.{s}.predict.{m}" for s in STAGES for m in ("seconds", "rows_per_s")),
    *(f"stage.{s}.train.{m}" for s in STAGES[:4] for m in ("seconds", "rows_per_s")),
    "e2e.predict.seconds",
    "e2e.predict.rows_per_s",
    "e2e.train.seconds",
    "e2e.train.rows_per_s",
    "compute.first_call_seconds",
    "compute.steady_rows_per_s",
    "data.coords_present",
    "data.coords_reserved",
    "data.occupancy",
    "data.overflow_dropped",
    "output.bytes",
    "quality.accuracy",
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
        spec = load_spec(DEFAULT_SPEC, OVERRIDES)
        summary = benchmark(spec=spec.to_dict(), spec_dir=str(DEFAULT_SPEC.parent))
    run = MlflowClient(tracking_uri=uri).get_run(summary["run_id"])
    return summary, run, folder, uri


@pytest.mark.slow
def test_run_finishes_with_every_metric_key(tpch_run, tpch_small):
    summary, run, _, _ = tpch_run
    assert run.info.status == "FINISHED"
    metrics = run.data.metrics
    missing = [k for k in REQUIRED_METRICS if k not in metrics]
    assert not missing, missing
    for stage in STAGES:  # every stage saw every order in each of the three passes: exact rows
        assert metrics[f"stage.{stage}.predict.rows"] == 3 * 15_000, stage
    assert "stage.write.train.seconds" not in metrics  # training writes nothing
    # e2e = the sum of the stages is the definition itself (RunResult sums them): it is tested
    # where the answer is known, on stub stages with scripted seconds
    # (tests/tasks/run/scenarios/test_region.py), not restated on a real run here.
    # rows/s over rows known without the code: three passes over the 15,000 orders
    assert metrics["data.rows_predicted"] == 3 * 15_000
    assert metrics["e2e.train.rows"] == metrics["stage.compute.train.rows"]
    # the first call is one of the compute stage's calls: inside its seconds, never beside them
    assert metrics["compute.first_call_seconds"] <= metrics["stage.compute.predict.seconds"]
    # compute alone runs at least as fast as the whole pass it is part of
    assert metrics["compute.steady_rows_per_s"] >= metrics["e2e.predict.rows_per_s"]
    # quality.accuracy recomputed from the written predictions and the orders' own labels, on
    # the held-out orders (the key hash), without the harness's scoring code
    from tasks.stages.split import split_is_train

    preds = pl.read_parquet(summary["output_path"]).join(
        pl.read_parquet(tpch_small / "orders.parquet", columns=["o_orderkey", "o_orderstatus"]),
        on="o_orderkey",
    )
    held = preds.filter(~split_is_train(preds["o_orderkey"], 0.2))
    assert metrics["quality.rows"] == held.height
    accuracy = (held["prediction"] == held["o_orderstatus"]).mean()
    assert metrics["quality.accuracy"] == pytest.approx(accuracy, abs=1e-9)
    assert summary["metrics"]["e2e.predict.seconds"] == pytest.approx(metrics["e2e.predict.seconds"])
    # the stage table has both phases, each with its own shares
    assert {(r["phase"], r["stage"]) for r in summary["stages"]} == {
        *(("train", s) for s in STAGES[:4]),
        *(("predict", s) for s in STAGES),
    }


@pytest.mark.slow
def test_the_runs_names_are_the_golden_ones(tpch_run):
    """Issue 42: a structural change keeps every metric, param and tag name (tests/golden.py)."""
    check_golden("reference", tpch_run[1])


@pytest.mark.slow
def test_every_logged_metric_is_catalogued(tpch_run):
    from tasks.measure.keys import documented

    _, run, _, _ = tpch_run
    assert not [k for k in run.data.metrics if not documented(k)]


@pytest.mark.slow
def test_exact_row_and_coordinate_counts(tpch_run, tpch_small):
    _, run, _, _ = tpch_run
    m = run.data.metrics
    orders = pq.ParquetFile(tpch_small / "orders.parquet").metadata.num_rows
    lines = pq.ParquetFile(tpch_small / "lineitem.parquet").metadata.num_rows
    assert orders == 15_000
    assert m["data.rows_written"] == orders
    assert m["data.root_rows"] == orders
    assert m["data.chunks"] == 2  # chunk_rows 10,000
    # no order has more than 7 lines, max_length is 8: nothing overflows
    assert m["data.overflow_dropped"] == 0
    # cells: the root's inputs + the (masked) target; lineitem's columns x 7 reserved rows:
    # max_length is 8 but no order has more than 7 lines, and no more rows are reserved
    # than the data has (issue 9)
    assert m["data.observed_max_rows.lineitem"] == 7
    assert m["data.reserved_rows.lineitem"] == 7
    spec = load_spec(DEFAULT_SPEC, OVERRIDES)
    root_cells = len(spec.schema_.root.columns) + 1
    line_cells = len(spec.schema_.branches[0].columns)
    assert m["data.coords_reserved"] == orders * (root_cells + 7 * line_cells)
    assert m["data.coords_present"] == orders * root_cells + lines * line_cells
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
    assert preds.height == keys.len() == run.data.metrics["data.rows_written"]
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
    local = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="spec.yaml", tracking_uri=uri)
    logged = parse_spec(yaml.safe_load(Path(local).read_text()))
    assert logged.spec_hash == tags["relflow.spec_hash"]
    assert logged == load_spec(DEFAULT_SPEC, OVERRIDES)
    assert summary["experiment"] == "tpch-orders"


MEASUREMENT_METRICS = [
    "compute.compile_overhead_seconds",
    "compute.estimated_rows_per_s",
    "compute.batch_ms.p50",
    "compute.batch_ms.p95",
    "compute.batch_ms.p99",
    "compute.recompiles",
    "compute.graph_breaks",
    "compute.steady_rows_per_s.median",
    "e2e.predict.rows_per_s.median",
    "compute.train.first_call_seconds",
    "compute.train.steady_rows_per_s",
    "compute.train.updates",
    "compute.train.updates_per_epoch",
    "compute.train.recompiles",
    "device.input_wait_fraction",
    "memory.host_peak_bytes",
    "memory.device_peak_bytes",
    "output.bytes_per_row",
    "harness.startup_seconds",
    "harness.orchestration_seconds",
    "harness.lock_wait_seconds",
    "harness.flow_overhead_seconds",
    "host.load_per_core_start",
    "host.other_cpu_fraction_before",
    "host.other_cpu_fraction",
    "compute.compiled_frames",
    "compute.compile_cache_hits",
    "compute.compile_cache_misses",
    "device.worker_startup_seconds",
    "compute.train.estimated_rows_per_s",
]
FINGERPRINT_TAGS = [
    "relflow.cpu_model",
    "relflow.cpu_count",
    "relflow.ram_bytes",
    "relflow.host_fingerprint",
    "relflow.git_dirty",
    "relflow.python_version",
    "relflow.prefect_version",
    "relflow.mlflow_version",
    "relflow.polars_version",
    "relflow.pyarrow_version",
    "relflow.torch_threads",
    "relflow.encoder_path",
]


@pytest.mark.slow
def test_measurement_metrics_are_recorded_and_sane(tpch_run):
    summary, run, _, _ = tpch_run
    m = run.data.metrics
    missing = [k for k in MEASUREMENT_METRICS if k not in m]
    assert not missing, missing
    for key in ("compute.steady_rows_per_s", "e2e.predict.rows_per_s"):
        assert f"{key}.median_ci_low" not in m  # 3 passes support no 95% interval
    assert run.data.tags["relflow.ci_method"].startswith("order-statistic")
    assert m["run.repeats_measured"] == 2  # passes after the first
    # three full predict passes over 15,000 orders, exact rows
    assert m["data.rows_predicted"] == 3 * m["data.root_rows"]
    # quality is scored on one pass: the held-out rows, not 3x them
    assert 0 < m["quality.rows"] < m["data.root_rows"]
    assert m["compute.recompiles"] == 0 and m["compute.graph_breaks"] == 0
    assert 0.0 <= m["device.input_wait_fraction"] < 1.0
    assert m["memory.host_peak_bytes"] > 0 and m["memory.device_peak_bytes"] == 0
    assert m["compute.train.updates"] == m["compute.train.updates_per_epoch"]  # one epoch
    # the prediction file's own size over its own row count, read here
    preds = Path(summary["output_path"])
    assert m["output.bytes_per_row"] == pytest.approx(preds.stat().st_size / pq.read_metadata(preds).num_rows)
    # Predict batches, known from the data: each pass cuts chunks of 10,000 and 5,000 orders
    # into batches of 512 (packing off): 20 + 10 batches, 90 over 3 passes. The first call
    # and 2 warm-up batches (full ones, in pass 0's first chunk) leave 87 steady batches of
    # 45,000 - 3 x 512 rows. The estimate (steady batches x 512 / their seconds) over the
    # exact rate (steady rows / the same seconds) is then 87 x 512 / 43,464.
    assert m["compute.steady_batches"] == 87
    assert m["compute.estimated_rows_per_s"] / m["compute.steady_rows_per_s"] == pytest.approx(
        87 * 512 / (45_000 - 3 * 512), rel=1e-9
    )
    tags = run.data.tags
    assert not [t for t in FINGERPRINT_TAGS if not tags.get(t)]


@pytest.mark.slow
def test_too_few_steady_batches_makes_the_run_invalid_but_finished(tpch_run):
    summary, run, _, _ = tpch_run
    assert run.info.status == "FINISHED"
    assert run.data.tags["relflow.validity"] == "INVALID"
    assert "run.min_steady_batches 100000" in run.data.tags["relflow.invalid_reasons"]
    assert summary["validity"] == "INVALID"
