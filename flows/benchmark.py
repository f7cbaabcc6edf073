"""The ``benchmark`` flow: one spec, five timed stages, one MLflow run.

    retrieve -> preprocess -> tensorize -> compute -> write

Root keys are processed in chunks of ``run.chunk_rows`` so memory stays bounded as data
grows; stage times add up over chunks (and over training epochs, which re-read their
chunks as a streaming trainer does). A single-chunk workload keeps its tensors between the
training and prediction passes instead of reading twice.

Every check that can fail on user input runs before the MLflow run starts. After that, any
error ends the run FAILED (KILLED for interrupts) and removes the partial prediction file.
Stage wrappers are thin Prefect tasks with ``NO_CACHE`` (hashing tables costs seconds);
each times its own work with the shared clock, never with Prefect's records.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from model.arrow import Encoding
from tasks import compute as compute_stage
from tasks import progress
from tasks.checkpoint import load_run_checkpoint, save_run_checkpoint
from tasks.clock import Clock, wall_clock
from tasks.data import ensure_tpch
from tasks.environment import fingerprint
from tasks.errors import UserError
from tasks.memory import PeakMemory
from tasks.preprocess import Preprocessed, preprocess
from tasks.records import RunResult
from tasks.retrieve import Retrieved, list_root_keys, retrieve
from tasks.sources import SourceTable, check_sources, resolve_sources
from tasks.spec import Spec, parse_spec
from tasks.tensorize import Tensorized, fit, tensorize
from tasks.tracking import Tracker, flatten
from tasks.write import PredictionWriter, to_table

STAGE_TASK = dict(cache_policy=NO_CACHE, persist_result=False, retries=0)


@task(name="retrieve", **STAGE_TASK)
def retrieve_task(spec: Spec, sources: dict[str, SourceTable], keys: np.ndarray,
                  clock: Clock) -> tuple[Retrieved, float]:
    with clock.measure() as span:
        out = retrieve(spec, sources, keys)
    return out, span.seconds


@task(name="preprocess", **STAGE_TASK)
def preprocess_task(spec: Spec, retrieved: Retrieved, clock: Clock) -> tuple[Preprocessed, float]:
    with clock.measure() as span:
        out = preprocess(spec, retrieved)
    return out, span.seconds


@task(name="tensorize", **STAGE_TASK)
def tensorize_task(spec: Spec, pre: Preprocessed, enc: Encoding | None, schema: Any,
                   clock: Clock) -> tuple[Tensorized, Encoding, Any, float]:
    with clock.measure() as span:
        if enc is None:  # no checkpoint: fit on the first chunk's training rows
            enc, schema = fit(spec, pre)
        out = tensorize(spec, pre, enc, schema)
    return out, enc, schema, span.seconds


@task(name="compute", **STAGE_TASK)
def compute_task(engine: compute_stage.Engine, tz: Tensorized, phase: str,
                 outputs: tuple[str, ...]) -> tuple[compute_stage.PredictOutputs | None, float]:
    with engine.clock.measure() as span:
        out = engine.train(tz) if phase == "train" else engine.predict(tz, outputs)
    return out, span.seconds


@task(name="write", **STAGE_TASK)
def write_task(spec: Spec, engine: compute_stage.Engine, enc: Encoding, tz: Tensorized,
               outs: compute_stage.PredictOutputs, writer: PredictionWriter,
               clock: Clock) -> float:
    with clock.measure() as span:
        writer.write(to_table(spec, engine.schema, enc, tz.keys, outs))
    return span.seconds


@dataclass
class Plan:
    """Everything checked before the run starts."""

    spec: Spec
    sources: dict[str, SourceTable]
    device: torch.device
    checkpoint: dict[str, Any] | None
    data_seconds: float
    generated: bool


def plan(spec: Spec, spec_dir: Path) -> Plan:
    """Validate inputs and make the data available; raises ``UserError`` before any work."""
    t0 = wall_clock()
    generated = False
    base = spec_dir
    if spec.source.generate is not None:
        base, generated = ensure_tpch(spec.source.generate.tpch.scale)
    sources = resolve_sources(spec, base)
    check_sources(spec, sources)
    device = compute_stage.resolve_device(spec)
    compute_stage.check_precision(spec, device)
    ckpt = None
    if spec.run.mode == "predict" and spec.run.checkpoint:
        ckpt = load_run_checkpoint(Path(spec.run.checkpoint), spec)
    return Plan(spec, sources, device, ckpt, wall_clock() - t0, generated)


def _execute(p: Plan, tracker: Tracker, result: RunResult, writer: PredictionWriter) -> tuple[
        compute_stage.Engine, Encoding]:
    spec = p.spec
    clock = Clock(p.device)
    st = result.stages
    with clock.measure() as span:
        all_keys, key_bytes = list_root_keys(spec, p.sources)
    st["retrieve"].add(span.seconds, 0)
    result.bytes_read += key_bytes
    result.root_rows = len(all_keys)
    chunks = [all_keys[i:i + spec.run.chunk_rows] for i in range(0, len(all_keys), spec.run.chunk_rows)]
    result.chunks = len(chunks)
    enc = schema = None
    if p.checkpoint is not None:
        enc, schema = p.checkpoint["encoding"], p.checkpoint["schema"]
    engine: compute_stage.Engine | None = None
    cache: dict[int, Tensorized] = {}

    counted: set[int] = set()

    def prepare(i: int) -> Tensorized:
        nonlocal enc, schema, engine
        if i in cache:
            return cache[i]
        progress.emit("stage", name="retrieve", chunk=i)
        r, sec = retrieve_task(spec, p.sources, chunks[i], clock)
        st["retrieve"].add(sec, r.root_rows)
        result.bytes_read += r.bytes_read
        progress.emit("stage", name="preprocess", chunk=i)
        pre, sec = preprocess_task(spec, r, clock)
        st["preprocess"].add(sec, pre.root_rows)
        progress.emit("stage", name="tensorize", chunk=i)
        tz, enc, schema, sec = tensorize_task(spec, pre, enc, schema, clock)
        st["tensorize"].add(sec, tz.root_rows)
        if i not in counted:  # data figures once per chunk, not once per epoch
            counted.add(i)
            result.coords_present += tz.coords_present
            result.coords_reserved += tz.coords_reserved
            for name, n in pre.overflow_dropped.items():
                result.overflow_dropped[name] = result.overflow_dropped.get(name, 0) + n
        if engine is None:
            state = p.checkpoint["model"] if p.checkpoint else None
            engine = compute_stage.Engine(spec, schema, p.device, state, clock)
        if len(chunks) == 1:
            cache[i] = tz
        return tz

    training = spec.run.mode == "train+predict"
    if training:
        for epoch in range(spec.run.epochs):
            for i in range(len(chunks)):
                tz = prepare(i)
                progress.emit("stage", name="compute", chunk=i, phase="train", epoch=epoch)
                _, sec = compute_task(engine, tz, "train", ())
                st["compute"].add(sec, int(tz.is_train.sum()))
    outputs = tuple(spec.task.outputs)
    for i in range(len(chunks)):
        tz = prepare(i)
        progress.emit("stage", name="compute", chunk=i, phase="predict")
        outs, sec = compute_task(engine, tz, "predict", outputs)
        st["compute"].add(sec, tz.root_rows)
        progress.emit("stage", name="write", chunk=i)
        st["write"].add(write_task(spec, engine, enc, tz, outs, writer, clock), tz.root_rows)
        result.rows_predicted += tz.root_rows
        progress.emit("chunk_done", chunk=i, chunks=len(chunks), rows=result.rows_predicted)
    assert engine is not None and enc is not None
    return engine, enc


@flow(name="benchmark", persist_result=False, validate_parameters=True)
def benchmark(spec: dict[str, Any], spec_dir: str = ".", launched_at: float | None = None
              ) -> dict[str, Any]:
    """Run one benchmark spec end to end and record it in MLflow; returns a summary."""
    flow_start = wall_clock()
    s = parse_spec(spec, "(flow parameter 'spec')")
    progress.emit("phase", name="checking inputs")
    p = plan(s, Path(spec_dir).resolve())
    progress.emit("phase", name="starting MLflow run")
    t0 = wall_clock()
    tracker = Tracker(s.name)
    tags = {"relflow.spec_hash": s.spec_hash, "relflow.spec_name": s.name, **fingerprint(p.device)}
    run_id = tracker.start(run_name=f"{s.name}-{s.run.mode}", tags=tags)
    mlflow_seconds = wall_clock() - t0
    output = Path(s.run.output_dir).resolve() / f"{s.name}-{run_id}.parquet"
    writer = PredictionWriter(output)
    result = RunResult()
    memory = PeakMemory(p.device).start()
    try:
        tracker.log_params(flatten(s.to_dict()))
        tracker.log_text(s.to_yaml(), "spec.yaml")
        body_start = wall_clock()
        engine, enc = _execute(p, tracker, result, writer)
        body_seconds = wall_clock() - body_start
        result.output_bytes = writer.commit()
        result.output_path = str(output)
        memory.stop()
        result.host_peak_bytes = memory.host_peak_bytes
        result.device_peak_bytes = memory.device_peak_bytes
        result.train = engine.train_timings if s.run.mode == "train+predict" else None
        result.predict = engine.predict_timings
        result.compute_seconds = engine.wall_seconds
        result.quality = engine.quality.metrics()
        result.extra.update({
            "harness.data_seconds": p.data_seconds,
            "harness.startup_seconds": (flow_start - launched_at if launched_at else 0.0)
            + mlflow_seconds,
            "harness.mlflow_startup_seconds": mlflow_seconds,
            "harness.orchestration_seconds": max(body_seconds - result.e2e_seconds, 0.0),
        })
        quality_meaningful = s.run.mode == "train+predict" or p.checkpoint is not None
        ckpt_path = None
        if s.run.mode == "train+predict":
            ckpt_path = output.with_suffix(".ckpt")
            save_run_checkpoint(ckpt_path, engine, enc, s)
            tracker.log_artifact(ckpt_path, "checkpoint")
        metrics = result.metrics()
        tracker.log_metrics(metrics)
        tracker.set_tags({
            "relflow.encoder_path": ",".join(sorted(engine.paths_seen)),
            "relflow.quality_meaningful": str(quality_meaningful).lower(),
            "relflow.output_path": str(output),
            "relflow.validity": "VALID",
        })
        stage_table = result.stage_table()
        tracker.log_dict(stage_table, "stages.json")
        tracker.log_text(_sample_csv(output), "predictions_sample.csv")
        tracker.finish()
    except BaseException as err:
        memory.stop()
        writer.abort()
        tracker.fail(err)
        raise
    return {
        "run_id": run_id,
        "experiment": s.name,
        "experiment_id": tracker.experiment_id,
        "tracking_uri": tracker.uri,
        "metrics": metrics,
        "stages": stage_table,
        "output_path": str(output),
        "checkpoint_path": str(ckpt_path) if ckpt_path else None,
        "quality_meaningful": quality_meaningful,
        "quality_metric": engine.quality.headline,
        "generated_data": p.generated,
        "encoder_path": ",".join(sorted(engine.paths_seen)),
    }


def _sample_csv(path: Path, rows: int = 100) -> str:
    import pyarrow.parquet as pq

    table = pq.ParquetFile(path).read_row_group(0).slice(0, rows)
    flat = {name: [str(v) for v in col.to_pylist()] for name, col in zip(
        table.column_names, table.columns, strict=True)}
    import pandas as pd

    return pd.DataFrame(flat).to_csv(index=False)


__all__ = ["benchmark", "plan", "UserError", "pa"]
