"""``model.library: lightgbm`` through the whole benchmark flow, on the shop tables: the stage
rows of both phases, training batches that are boosting rounds, every root predicted in key
order, the library's tags and versions, no FLOPs or model floors, and a checkpoint that a
predict run serves. Then on the default workload (TPC-H orders, one epoch): its held-out
accuracy's 95% interval lies above the majority class's rate, and serving that run's checkpoint
over 16 passes is a VALID run (tasks/libraries/lightgbm/README.md: the training run can only be
INVALID there, for its steady windows: LightGBM finishes in well under a second).

Slow: a Prefect flow and MLflow, three times.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mlflow.tracking import MlflowClient

STAGES = ("retrieve", "preprocess", "tensorize", "compute", "calibrate", "write")


@pytest.mark.slow
def test_a_lightgbm_run_records_every_stage_and_its_checkpoint_serves_a_predict_run(
    prefect_harness, shop_spec, shop_tables, write_tables, tmp_path, monkeypatch
):
    from flows.benchmark import benchmark
    from tasks.spec import parse_spec

    customers = shop_tables["customers"]
    churn = pa.array(["yes", "yes", "no", "yes", "no"])  # the training split holds both classes
    shop_tables["customers"] = customers.set_column(customers.schema.get_field_index("churn"), "churn", churn)
    shop_files = write_tables(shop_tables)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    shop_spec["model"] = {"library": "lightgbm"}
    shop_spec["run"] |= {"epochs": 2, "batch_size": 2, "system_metrics_interval_s": 0, "warmup_batches": 2}
    shop_spec["task"]["validation_fraction"] = 0.4  # customers 1 and 4 held out (the stable key hash)
    summary = benchmark(spec=parse_spec(shop_spec).to_dict(), spec_dir=str(shop_files))
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(summary["run_id"])
    assert run.info.status == "FINISHED"
    m, tags = run.data.metrics, run.data.tags
    assert {(r["phase"], r["stage"]) for r in summary["stages"]} == {
        *(("train", s) for s in STAGES[:4]),
        *(("predict", s) for s in STAGES),
    }
    assert m["data.rows_predicted"] == m["data.rows_written"] == 5 and m["e2e.train.epochs"] == 2
    # a training batch is one boosting round over the 3 training rows; with 3 rows (fewer than
    # LightGBM's 20 per leaf) its first round finds no split and LightGBM says it is finished:
    # one round per epoch, one tree per class
    assert m["compute.train.updates_per_epoch"] == 1 and m["compute.train.updates"] == 2
    assert tags["relflow.library"] == "lightgbm" and tags["relflow.library_version"] == "4.7.0"
    assert tags["relflow.lightgbm_version"] == "4.7.0" and tags["relflow.backend"] == "lightgbm"
    assert tags["relflow.library_model"].startswith("multiclass gbdt, 4 trees in 2 stage(s)")
    assert "model.flops_per_root_row" not in m and "compute.mfu" not in m and "relflow.flops_note" in tags
    assert "floor.compute.fraction" not in m and "floor.tensorize.fraction" not in m  # not the reference's work
    table = pq.read_table(summary["output_path"])
    assert table["c_id"].to_pylist() == [1, 2, 3, 4, 5]
    checkpoint = Path(summary["checkpoint_path"])
    assert checkpoint.is_file()

    # the checkpoint serves a predict run: the same predictions, quality meaningful
    shop_spec["run"] |= {"mode": "predict", "checkpoint": str(checkpoint)}
    again = benchmark(spec=parse_spec(shop_spec).to_dict(), spec_dir=str(shop_files))
    assert pq.read_table(again["output_path"]).equals(table)
    assert client.get_run(again["run_id"]).data.metrics["quality.rows"] == m["quality.rows"] == 2


@pytest.mark.slow
def test_on_the_default_workload_it_beats_the_majority_class_and_its_predict_run_is_valid(
    prefect_harness, tpch_small, tmp_path, monkeypatch
):
    """One epoch (one stage of 100 boosting rounds) on the default workload: o_orderstatus is
    learnable only through the lineitem branch (F when every line is F, O when every line is O,
    else P), so the flattened line counts per l_linestatus must carry it: the accuracy's
    bootstrap interval over the 3,017 held-out orders lies wholly above the majority rate (0.497)."""
    from flows.benchmark import benchmark
    from tasks.spec import load_spec
    from tests.repo import DEFAULT_SPEC, NO_SYSTEM_METRICS

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # the validity rules as they are, but for the host's load: other tests share these cores
    shared = [*NO_SYSTEM_METRICS, "run.max_host_load=null", "run.threads.intra_op=1"]
    spec = load_spec(DEFAULT_SPEC, ["model.library=lightgbm", "run.epochs=1", *shared])
    summary = benchmark(spec=spec.to_dict(), spec_dir=str(DEFAULT_SPEC.parent))
    client = MlflowClient(tracking_uri=uri)
    m = client.get_run(summary["run_id"]).data.metrics
    assert m["quality.rows"] == 3017 and m["quality.unseen_class_rows"] == 0
    assert 0.45 < m["quality.majority_rate"] < 0.55
    assert m["quality.accuracy.ci_low"] > m["quality.majority_rate"], m
    assert m["quality.accuracy"] > 0.95  # the status is a function of the line statuses
    # what can make the training run INVALID here is its steady windows, and only those
    assert all("steady_" in r for r in summary["invalid_reasons"]), summary["invalid_reasons"]

    served = load_spec(
        DEFAULT_SPEC,
        [
            "model.library=lightgbm",
            "run.mode=predict",
            f"run.checkpoint={summary['checkpoint_path']}",
            "run.repeats=16",  # 16 passes of 59 batches: about 2 s of steady predict batches
            *shared,
        ],
    )
    again = benchmark(spec=served.to_dict(), spec_dir=str(DEFAULT_SPEC.parent))
    assert again["validity"] == "VALID", again["invalid_reasons"]
    run = client.get_run(again["run_id"])
    assert run.data.tags["relflow.validity"] == "VALID"
    p = run.data.metrics
    assert p["compute.steady_batches"] >= 10 * 16 and p["compute.steady_seconds"] >= 1.0
    assert p["quality.rows"] == 3017 and p["quality.accuracy"] == m["quality.accuracy"]  # the same model
