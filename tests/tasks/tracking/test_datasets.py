"""What a run records about its data and model: dataset inputs, model interface, description,
and the experiment kind, against a temp SQLite MLflow store (no Prefect)."""

from __future__ import annotations

from pathlib import Path

import mlflow
import mlflow.pytorch
import pyarrow as pa
import pytest
import torch
from mlflow.tracking import MlflowClient

from tasks.libraries.reference.engine import Engine
from tasks.measure.records import STAGES
from tasks.runtime.masking import mask_uri
from tasks.sources.files import resolve_sources
from tasks.spec import parse_spec
from tasks.tracking.datasets import describe_sources, model_input_schema, model_interface
from tasks.tracking.reader import runs_page
from tasks.tracking.run_note import run_description
from tasks.tracking.writer import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, RUN_NOTE_TAG, Tracker

pytestmark = pytest.mark.slow  # real MLflow SQLite stores and logged models


def test_database_sources_are_shown_masked():
    assert mask_uri("postgresql://bench:s3cret@db.local:5433/tpch?sslmode=require") == (
        "postgresql://bench:***@db.local:5433/tpch?sslmode=require"
    )
    assert mask_uri("duckdb:///data/x.duckdb") == "duckdb:///data/x.duckdb"
    assert "s3cret" not in mask_uri("postgresql://:s3cret@h/db")


def test_every_experiment_is_a_model_development_experiment(mlflow_uri):
    client = MlflowClient(mlflow_uri)
    Tracker("fresh")
    assert client.get_experiment_by_name("fresh").tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    old = client.create_experiment("made-elsewhere")  # e.g. a store from before the tag existed
    Tracker("made-elsewhere")
    assert client.get_experiment(old).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    assert runs_page("http://127.0.0.1:5000/", old) == (
        f"http://127.0.0.1:5000/#/experiments/{old}/runs?workflowType=machine_learning"
    )


def test_dataset_inputs_name_source_digest_and_schema(mlflow_uri, shop_spec, shop_files):
    spec = parse_spec(shop_spec)
    sources = resolve_sources(spec, shop_files)
    infos = describe_sources(spec, sources)
    tracker = Tracker("shop")
    run_id = tracker.start("r", {})
    tracker.log_datasets(
        [
            *infos,
            infos[0].__class__(
                "remote", mask_uri("postgresql://u:pw@h/db"), "d1", pa.schema([("x", pa.int64())]), "predict"
            ),
        ]
    )
    tracker.finish()
    inputs = {d.dataset.name: d for d in MlflowClient(mlflow_uri).get_run(run_id).inputs.dataset_inputs}
    assert set(inputs) == {"customers", "orders", "lines", "remote"}
    orders = inputs["orders"]
    assert orders.dataset.source_type == "local" and str(shop_files / "orders.parquet") in orders.dataset.source
    assert orders.dataset.digest == infos[1].digest and '"o_total"' in orders.dataset.schema
    assert [t.value for t in orders.tags if t.key == "mlflow.data.context"] == ["train+predict"]
    assert inputs["remote"].dataset.source_type == "url" and "pw" not in inputs["remote"].dataset.source

    # other data, other digest: the runs table tells runs over different data apart
    table = pa.table({"o_id": [1], "o_cust": [1], "o_date": [None], "o_total": [1.0], "o_status": ["x"]})
    import pyarrow.parquet as pq

    pq.write_table(table, shop_files / "orders.parquet")
    assert describe_sources(spec, resolve_sources(spec, shop_files))[1].digest != infos[1].digest


def test_model_input_schema_nests_branches_and_leaves_out_the_target(shop_spec, shop_files):
    spec = parse_spec(shop_spec)
    schema = model_input_schema(spec, resolve_sources(spec, shop_files))
    assert schema.names == ["c_balance", "c_segment", "c_since", "orders"]  # no churn (the target)
    orders = schema.field("orders").type
    assert pa.types.is_list(orders)
    assert [f.name for f in orders.value_type] == ["o_date", "o_total", "o_status", "lines"]
    assert [f.name for f in orders.value_type.field("lines").type.value_type] == ["l_qty", "l_flag"]


def test_logged_model_has_a_signature_and_loads_back(mlflow_uri, shop_spec, shop_files, prepare_chunk):
    spec, enc, schema, tz = prepare_chunk(shop_spec, shop_files)
    engine = Engine(spec, schema, torch.device("cpu"), encoding=enc)
    engine.train(tz)
    outputs = engine.needed_outputs(("prediction", "root_embedding"))
    interface = model_interface(spec, resolve_sources(spec, shop_files), schema, engine.model.config, outputs)
    tracker = Tracker("shop")
    run_id = tracker.start("r", {})
    uri = tracker.log_model(engine.model, interface)
    tracker.finish()
    # Logging a model leaves the fluent API's URI unset: later runs follow MLFLOW_TRACKING_URI.
    assert mlflow.get_tracking_uri() == mlflow_uri
    info = mlflow.models.get_model_info(uri)
    sig = info.signature.to_dict()
    assert '"c_balance"' in sig["inputs"] and '"orders"' in sig["inputs"] and '"churn"' not in sig["inputs"]
    assert '"prediction"' in sig["outputs"] and '"root_embedding"' in sig["outputs"]
    classes = schema.target.num_classes
    assert f'"shape": [-1, {classes}]' in sig["outputs"]
    (logged,) = MlflowClient(mlflow_uri).search_logged_models([engine_exp(mlflow_uri)])
    assert logged.source_run_id == run_id and str(logged.status) == "READY"
    run = MlflowClient(mlflow_uri).get_run(run_id)
    assert [m.model_id for m in run.outputs.model_outputs] == [logged.model_id]  # the Models column
    loaded = mlflow.pytorch.load_model(uri)
    engine.model.eval()
    loaded.eval()
    with torch.no_grad():
        want = engine.model(tz.batch, outputs=outputs)
        got = loaded(tz.batch, outputs=outputs)
    assert all(torch.equal(want[k], got[k]) for k in outputs)


def test_logging_a_model_skips_mlflows_requirement_scan_which_cannot_warn(
    mlflow_uri, shop_spec, shop_files, prepare_chunk, monkeypatch
):
    """MLflow's mismatch check maps every installed distribution (1.4 s per process) to warn
    when a requirement is not what this environment runs; ours are pinned to exactly that, so
    the scan is skipped, and the requirements logged still say the running versions."""
    import numpy as np
    from mlflow.utils import requirements_utils

    spec, enc, schema, tz = prepare_chunk(shop_spec, shop_files)
    engine = Engine(spec, schema, torch.device("cpu"), encoding=enc)
    interface = model_interface(spec, resolve_sources(spec, shop_files), schema, engine.model.config, ("prediction",))
    assert all(requirements_utils._check_requirement_satisfied(r) is None for r in interface.requirements)
    scans = []
    real = requirements_utils._init_packages_to_modules_map
    monkeypatch.setattr(requirements_utils, "_init_packages_to_modules_map", lambda: scans.append(1) or real())
    tracker = Tracker("shop")
    tracker.start("r", {})
    uri = tracker.log_model(engine.model, interface)
    tracker.finish()
    assert scans == []
    logged = (Path(mlflow.artifacts.download_artifacts(artifact_uri=uri)) / "requirements.txt").read_text().split()
    torch_version = torch.__version__.split("+")[0]
    for want in (f"torch=={torch_version}", f"numpy=={np.__version__}", f"pyarrow=={pa.__version__}"):
        assert want in logged


def engine_exp(uri: str) -> str:
    return MlflowClient(uri).get_experiment_by_name("shop").experiment_id


def test_run_description_holds_the_stage_table_and_verdict(mlflow_uri):
    table = [
        {"phase": "predict", "stage": s, "seconds": 0.5, "rows": 100, "rows_per_s": 200.0, "share": 0.2} for s in STAGES
    ]
    metrics = {
        "e2e.predict.seconds": 2.5,
        "e2e.predict.rows": 100,
        "e2e.predict.rows_per_s": 40.0,
        "compute.steady_rows_per_s": 900.0,
        "compute.first_call_seconds": 0.25,
        "quality.accuracy": 0.75,
        "memory.host_peak_bytes": 2**30,
    }
    md = run_description("shop", table, metrics, ["run.min_steady_batches 10 > 3 steady batches"], "accuracy", True)
    assert "**INVALID**: run.min_steady_batches 10 > 3" in md
    assert all(f"| predict | {s} | 0.500 |" in md for s in STAGES)
    assert "| **predict** | **end-to-end predict (headline)** | **2.500** | 100 |" in md
    assert "| train |" not in md
    assert "accuracy 0.7500" in md
    tracker = Tracker("shop")
    run_id = tracker.start("r", {})
    tracker.set_description(md)
    tracker.finish()
    assert MlflowClient(mlflow_uri).get_run(run_id).data.tags[RUN_NOTE_TAG] == md


@pytest.mark.parametrize("reasons", [[]])
def test_a_valid_run_says_so(reasons):
    table = [
        {"phase": "predict", "stage": s, "seconds": 1.0, "rows": 1, "rows_per_s": 1.0, "share": 0.2} for s in STAGES
    ]
    metrics = {
        "e2e.predict.seconds": 5.0,
        "e2e.predict.rows": 1,
        "e2e.predict.rows_per_s": 0.2,
        "compute.steady_rows_per_s": 1.0,
        "compute.first_call_seconds": 1.0,
        "memory.host_peak_bytes": 0,
    }
    md = run_description("x", table, metrics, reasons, None, False)
    assert md.startswith("### x: **VALID**") and "quality" not in md


def test_a_dataset_insert_lost_to_a_concurrent_run_is_retried_and_other_errors_are_not(
    mlflow_uri, shop_spec, shop_files
):
    """Two runs over the same tables logging at once on a shared server: MLflow's store looks
    each dataset up, then inserts it, so both can miss and the later insert fails on the unique
    key (seen on PostgreSQL with four hosts: "duplicate key value violates unique constraint
    dataset_pk"). The state such a loss leaves is made for real (the other run's datasets are
    stored first), the lost insert's error is the store's own wording; the run still gets its inputs."""
    from mlflow.exceptions import MlflowException

    spec = parse_spec(shop_spec)
    infos = describe_sources(spec, resolve_sources(spec, shop_files))
    other, tracker = Tracker("shop"), Tracker("shop")
    other.start("winner", {})
    run_id = tracker.start("loser", {})
    real = tracker.client.log_inputs
    calls: list[int] = []

    def lose_the_race_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            other.log_datasets(infos)  # the concurrent run's insert lands first
            raise MlflowException(
                "(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id, datasets.name, "
                "datasets.digest"
            )
        return real(*args, **kwargs)

    tracker.client.log_inputs = lose_the_race_once
    tracker.log_datasets(infos)
    assert len(calls) == 2
    got = {d.dataset.name for d in MlflowClient(mlflow_uri).get_run(run_id).inputs.dataset_inputs}
    assert got == {"customers", "orders", "lines"}

    def refuse(*args, **kwargs):
        calls.append(1)
        raise MlflowException("INVALID_PARAMETER_VALUE: dataset name too long")

    tracker.client.log_inputs = refuse
    calls.clear()
    with pytest.raises(MlflowException, match="too long"):
        tracker.log_datasets(infos)
    assert len(calls) == 1  # not a race: no retry
    other.finish()
    tracker.finish()
