"""``run.backend: onnxruntime`` end to end through the benchmark flow (Prefect harness, temp
MLflow store): train with PyTorch, export the trained checkpoint outside e2e, serve the
predict pass from ONNX Runtime; then a predict run from an int8 checkpoint judged against
its fp16 reference."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
import torch
from mlflow.tracking import MlflowClient

from model.checkpoint import file_sha256, quantize_checkpoint
from tasks.measure import keys as K
from tasks.measure.keys import documented
from tasks.spec import parse_spec
from tasks.stages.split import split_is_train


@pytest.mark.slow
def test_onnxruntime_run_end_to_end(prefect_harness, shop_spec, shop4_files, tmp_path, monkeypatch):
    from flows.benchmark import benchmark

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    raw = copy.deepcopy(shop_spec)
    raw["run"].update(
        backend="onnxruntime",
        system_metrics_interval_s=0,
        min_steady_batches=1,
        min_steady_seconds=0.000001,
        onnxruntime={"intra_op_threads": 1},
        check_outputs=True,
    )
    s = parse_spec(raw)
    # the floor ledger's thread count (issue 43 item 3): what the run asks it at
    from tasks.run import floors

    ledger_threads: list[int] = []
    measured = floors._ledger

    def noted(*args, **kwargs):
        ledger_threads.append(torch.get_num_threads())
        return measured(*args, **kwargs)

    monkeypatch.setattr(floors, "_ledger", noted)
    summary = benchmark(spec=s.to_dict(), spec_dir=str(shop4_files))
    run = MlflowClient(tracking_uri=uri).get_run(summary["run_id"])
    m, tags = run.data.metrics, run.data.tags
    assert run.info.status == "FINISHED"
    # The session has 1 intra-op thread (run.onnxruntime.intra_op_threads), whatever torch's
    # count: the predict MFU's peak and the floors are at 1, the process's peak stays the host's
    # (the old code: MFU against the process's peak, floors at the process's count).
    assert tags["relflow.onnxruntime.intra_op_threads"] == "1"
    assert ledger_threads == [1]
    assert m[K.PREDICT_INTRA_OP_THREADS] == 1.0
    own_peak = m[K.PREDICT_REQUEST_PEAK_FLOPS_PER_S]
    assert m[K.compute("predict", K.MFU)] == pytest.approx(m[K.compute("predict", K.MODEL_FLOPS_PER_S)] / own_peak)
    assert tags["relflow.backend"] == "onnxruntime"
    assert tags["relflow.providers"] == "CPUExecutionProvider"
    assert tags["relflow.onnxruntime_version"] == __import__("onnxruntime").__version__
    assert len(tags["relflow.bundle_hash"]) == 64
    # training ran PyTorch (packed: no dropout), the predict pass ONNX Runtime's padded graph
    assert tags["relflow.encoder_path"] == "packed,padded"
    # Export and load happen outside the predict stages, in the region's backend_setup bucket,
    # which is measured less any stage seconds inside it: had the export landed in a stage
    # (or in orchestration), the bucket would hold less than the export and load themselves.
    assert m["export.seconds"] > 0 and m["backend.load_seconds"] > 0
    assert m["export.bytes"] == (Path(tags["relflow.bundle_path"]) / "model.onnx").stat().st_size
    assert m["harness.backend_setup_seconds"] >= (m["export.seconds"] + m["backend.load_seconds"]) * (1 - 1e-9)
    assert m["harness.orchestration_seconds"] < m["export.seconds"]  # the export is not orchestration
    assert m["data.rows_predicted"] == 20 and m["compute.first_call_seconds"] > 0
    out = pl.from_arrow(pq.read_table(summary["output_path"]))
    assert out.height == 20 and out["c_id"].n_unique() == 20
    # quality.accuracy is its definition: ONNX Runtime's served predictions (the kept file) of
    # the held-out, labelled customers (the hash split), against their labels.
    labels = pl.read_parquet(shop4_files / "customers.parquet").select("c_id", "churn")
    joined = out.join(labels, on="c_id")
    held = joined.filter(~split_is_train(joined["c_id"], 0.2) & joined["churn"].is_not_null())
    assert m["quality.rows"] == held.height == 5
    assert m["quality.accuracy"] == pytest.approx((held["prediction"] == held["churn"]).mean(), abs=1e-12)
    # ONNX Runtime computes what eager PyTorch computes for every root (run.check_outputs)
    assert m["predict.outputs_roots_checked"] == 20 and m["predict.outputs_mismatched_roots"] == 0
    assert m["predict.outputs_tolerance"] == 1e-4 and "predict.outputs" not in tags.get("relflow.invalid_reasons", "")
    # the bundle served is the export of the run's own checkpoint (saved before serving)
    manifest = json.loads((Path(tags["relflow.bundle_path"]) / "manifest.json").read_text())
    assert manifest["checkpoint_sha256"] == file_sha256(summary["checkpoint_path"])
    assert not [k for k in m if not documented(k)]

    # predict from an int8 checkpoint of that run, against its fp16 version
    ckpt = summary["checkpoint_path"]
    quantize_checkpoint(ckpt, tmp_path / "s.int8.ckpt", "int8")
    quantize_checkpoint(ckpt, tmp_path / "s.fp16.ckpt", "fp16")
    raw2 = copy.deepcopy(raw)
    raw2["run"].update(
        backend="pytorch",
        mode="predict",
        checkpoint=str(tmp_path / "s.int8.ckpt"),
        reference_checkpoint=str(tmp_path / "s.fp16.ckpt"),
        max_quality_drop=0.0,
        onnxruntime={},
    )
    second = benchmark(spec=parse_spec(raw2).to_dict(), spec_dir=str(shop4_files))
    run2 = MlflowClient(tracking_uri=uri).get_run(second["run_id"])
    m2, tags2 = run2.data.metrics, run2.data.tags
    assert tags2["relflow.backend"] == "pytorch" and tags2["relflow.weights_format"] == "int8"
    assert m2["checkpoint.bytes"] == (tmp_path / "s.int8.ckpt").stat().st_size
    assert m2["memory.model_bytes_after_load"] == m2["memory.model_bytes_fp32"]
    # The reference pass is what a run of the fp16 checkpoint itself reports, over the same
    # held-out rows: derived from an independent predict run, not restated from the rule.
    raw3 = copy.deepcopy(raw2)
    raw3["run"].update(checkpoint=str(tmp_path / "s.fp16.ckpt"), reference_checkpoint=None, max_quality_drop=None)
    third = benchmark(spec=parse_spec(raw3).to_dict(), spec_dir=str(shop4_files))
    m3 = MlflowClient(tracking_uri=uri).get_run(third["run_id"]).data.metrics
    assert m3["quality.rows"] == m2["quality.rows"] == 5
    assert m2["quality.reference.accuracy"] == pytest.approx(m3["quality.accuracy"], abs=1e-12)
    assert m2["quality.delta_vs_reference"] == pytest.approx(m2["quality.accuracy"] - m3["quality.accuracy"], abs=1e-12)
    drop = m2["quality.drop_vs_reference"]
    assert drop == pytest.approx(-m2["quality.delta_vs_reference"], abs=1e-12)  # accuracy: higher is better
    # the drop rule's verdict (other rules may also fire on a loaded host: not this test's subject)
    assert ("run.max_quality_drop" in tags2["relflow.invalid_reasons"]) == (drop > 0.0), tags2[
        "relflow.invalid_reasons"
    ]
    assert not [k for k in m2 if not documented(k)]
