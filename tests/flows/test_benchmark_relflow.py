"""``model.library: relflow`` through the whole benchmark flow, on the shop tables: the five
stage rows of both phases, exact row counts, the prediction file in key order, the library's
tags and the throughput estimate beside the exact rows; and a setting relflow cannot honour
refused by the CLI before any work.

Slow: relflow's import (Lightning) and a Prefect flow; the model is tiny.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from mlflow.tracking import MlflowClient

from tests.golden import check_golden

STAGES = ("retrieve", "preprocess", "tensorize", "compute", "calibrate", "write")


@pytest.mark.slow
def test_a_relflow_run_records_every_stage_and_predicts_every_root_in_key_order(
    prefect_harness, shop_spec, shop_tables, write_tables, tmp_path, monkeypatch
):
    import pyarrow as pa

    from flows.benchmark import benchmark
    from tasks.spec import parse_spec

    # customer 2 churns too, so the training split (customers 2, 3 and 5) holds both classes
    customers = shop_tables["customers"]
    churn = pa.array(["yes", "yes", "no", "yes", "no"])
    shop_tables["customers"] = customers.set_column(customers.schema.get_field_index("churn"), "churn", churn)
    shop_files = write_tables(shop_tables)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    shop_spec["model"] = {"library": "relflow", "d_model": 8, "layers": 1, "heads": 2}
    shop_spec["run"] |= {"epochs": 2, "batch_size": 2, "system_metrics_interval_s": 0}
    shop_spec["task"]["validation_fraction"] = 0.4  # customers 1 and 4 held out (the stable key hash)
    # relflow's ThroughputLogger reads perf_counter once at each batch's start hook and once at
    # its end hook: a clock that steps 0.5 s per read gives every batch 0.5 hook seconds, so its
    # figure for a batch is exactly 2 x that batch's rows
    import relflow.logging.throughput as relflow_throughput

    ticks = iter(range(10**6))
    monkeypatch.setattr(relflow_throughput, "perf_counter", lambda: 0.5 * next(ticks))
    from tasks.libraries.relflow.driver import RelflowDriver

    losses: list[float] = []
    train_step = RelflowDriver.train_step

    def recorded_step(self: RelflowDriver, td: object) -> float:
        losses.append(train_step(self, td))  # type: ignore[arg-type]
        return losses[-1]

    monkeypatch.setattr(RelflowDriver, "train_step", recorded_step)
    summary = benchmark(spec=parse_spec(shop_spec).to_dict(), spec_dir=str(shop_files))
    run = MlflowClient(tracking_uri=uri).get_run(summary["run_id"])
    assert run.info.status == "FINISHED"
    m = run.data.metrics
    assert {(r["phase"], r["stage"]) for r in summary["stages"]} == {
        *(("train", s) for s in STAGES[:4]),
        *(("predict", s) for s in STAGES),
    }
    # 5 customers, every one predicted once and written once; 2 epochs over the training rows
    assert m["data.rows_predicted"] == m["data.rows_written"] == m["stage.tensorize.predict.rows"] == 5
    assert m["e2e.train.epochs"] == 2
    # batches of 2 over 5 predict rows: 3 batches (2, 2, 1); the first is the first call, the
    # two steady ones hold 3 rows while the estimate counts 2 x 2 = 4 over the same seconds
    steady_s = m["compute.steady_seconds"]
    assert m["compute.steady_rows_per_s"] == pytest.approx(3 / steady_s, rel=1e-6)
    assert m["compute.estimated_rows_per_s"] == pytest.approx(4 / steady_s, rel=1e-6)
    # relflow's own ThroughputLogger figures land beside them (their definitions are tested with
    # a scripted clock in tests/tasks/libraries/test_relflow_side.py)
    # predict pass: steady batches of 2 and 1 rows -> relflow's 4 and 2 rows/s, mean 3; the last
    # (1 row) 2. Training: batches of 2 and 1 rows in each of 2 epochs, the run's first batch the
    # first call: steady 1, 2 and 1 rows -> 2, 4, 2 rows/s, mean 8/3
    assert m["compute.library_logger.steady_mean_rows_per_s"] == 3.0
    assert m["compute.library_logger.last_rows_per_s"] == 2.0
    assert m["compute.train.library_logger.steady_mean_rows_per_s"] == pytest.approx(8 / 3, rel=1e-12)
    assert m["compute.train.library_logger.last_rows_per_s"] == 2.0
    assert len(losses) == 4 and m["compute.train.library_logger.last_loss"] == pytest.approx(losses[-1], rel=1e-6)
    # the training tensorize encodes the 3 training rows of each of the 2 epochs, not all 5
    assert m["stage.tensorize.train.rows"] == 2 * 3 and m["stage.preprocess.train.rows"] == 2 * 5
    tags = run.data.tags
    assert tags["relflow.library"] == "relflow"
    assert tags["relflow.library_version"] == "0.4.0"
    assert tags["relflow.relflow_version"] == "0.4.0" and tags["relflow.lightning_version"] != "absent"
    assert "packed" in tags["relflow.library_packing"] or "no encoder layers" in tags["relflow.library_packing"]
    assert run.data.params["model.library"] == "relflow"
    table = pq.read_table(summary["output_path"])
    assert table["c_id"].to_pylist() == [1, 2, 3, 4, 5]
    assert set(table["prediction"].to_pylist()) <= {"yes", "no"}
    assert Path(summary["checkpoint_path"]).is_file()
    check_golden("relflow", run)  # issue 42: a structural change keeps every name


@pytest.mark.slow
def test_a_setting_relflow_cannot_honour_exits_2_before_any_work(tmp_path):
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "run",
            "--set",
            "model.library=relflow",
            "--set",
            "run.backend=onnxruntime",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    out = " ".join((done.stdout + done.stderr).split())
    assert "model.library relflow cannot honour run.backend='onnxruntime'" in out
    assert "use run.backend: pytorch" in out
    assert not (tmp_path / "data").exists()  # refused before any data was generated
