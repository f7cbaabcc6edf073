"""The ``benchmark`` flow: one spec, five timed stages, one MLflow run.

    retrieve -> preprocess -> tensorize -> compute -> write

Root keys are processed in chunks of ``run.chunk_rows`` so memory stays bounded as data
grows; stage times add up over chunks (and over training epochs, which re-read their
chunks as a streaming trainer does, except a single-chunk workload, which keeps its tensors
between epochs). Every predict pass runs all five stages.

Every check that can fail on user input runs before the MLflow run starts. After that, any
error ends the run FAILED (KILLED for interrupts) and removes the partial prediction file.
Stage wrappers are thin Prefect tasks with ``NO_CACHE`` (hashing tables costs seconds);
each times its own work with the shared clock, never with Prefect's records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import torch
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.artifacts import publish_run_artifact
from model.arrow import Encoding
from model.meta import inspect_on_meta
from tasks import compute as compute_stage
from tasks import progress
from tasks.backends.setup import BackendPlan, check_backend, start_backend
from tasks.checkpoint import load_run_checkpoint, save_run_checkpoint
from tasks.clock import Clock, unix_time, wall_clock
from tasks.data import ensure_tpch
from tasks.environment import fingerprint, host_load_per_core
from tasks.hostlock import host_lock
from tasks.memory import PeakMemory
from tasks.preprocess import Preprocessed, preprocess
from tasks.records import BackendSetup, RunResult
from tasks.reference import check_reference, drop_reasons, quality_delta, reference_quality
from tasks.retrieve import Retrieved, list_root_keys, retrieve
from tasks.sources import SourceTable, check_sources, resolve_sources
from tasks.spec import Spec, parse_spec
from tasks.tensorize import Tensorized, fit, tensorize
from tasks.tracking import Tracker, flatten
from tasks.validity import verdict
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
    backend: BackendPlan = field(default_factory=BackendPlan)
    reference: dict[str, Any] | None = None


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
    backend, ckpt = check_backend(spec, ckpt)
    reference = check_reference(spec, ckpt["encoding"] if ckpt else None)
    return Plan(spec, sources, device, ckpt, wall_clock() - t0, generated, backend, reference)


class Pipeline:
    """Runs the chunked stages for one plan and accumulates into one ``RunResult``."""

    def __init__(self, p: Plan, result: RunResult) -> None:
        self.p, self.spec, self.result = p, p.spec, result
        self.clock = Clock(p.device)
        self.enc: Encoding | None = p.checkpoint["encoding"] if p.checkpoint else None
        self.schema = p.checkpoint["schema"] if p.checkpoint else None
        self.engine: compute_stage.Engine | None = None
        self.chunks: list[np.ndarray] = []
        self._cache: dict[int, Tensorized] = {}
        self._counted: set[int] = set()

    def list_keys(self) -> None:
        with self.clock.measure() as span:
            keys, nbytes = list_root_keys(self.spec, self.p.sources)
        self.result.stages["retrieve"].add(span.seconds, 0)
        self.result.bytes_read += nbytes
        self.result.root_rows = len(keys)
        n = self.spec.run.chunk_rows
        self.chunks = [keys[i:i + n] for i in range(0, len(keys), n)]
        self.result.chunks = len(self.chunks)

    def prepare(self, i: int, reuse: bool = False) -> Tensorized:
        """retrieve -> preprocess -> tensorize for chunk ``i``.

        With ``reuse`` (training epochs) a single-chunk workload keeps its tensors instead of
        re-reading each epoch; predict passes always run every stage, so each pass is a full,
        comparable measurement of the serving path."""
        if reuse and i in self._cache:
            return self._cache[i]
        spec, st, clock = self.spec, self.result.stages, self.clock
        progress.emit("stage", name="retrieve", chunk=i)
        r, sec = retrieve_task(spec, self.p.sources, self.chunks[i], clock)
        st["retrieve"].add(sec, r.root_rows)
        self.result.bytes_read += r.bytes_read
        progress.emit("stage", name="preprocess", chunk=i)
        pre, sec = preprocess_task(spec, r, clock)
        st["preprocess"].add(sec, pre.root_rows)
        progress.emit("stage", name="tensorize", chunk=i)
        tz, self.enc, self.schema, sec = tensorize_task(spec, pre, self.enc, self.schema, clock)
        st["tensorize"].add(sec, tz.root_rows)
        if i not in self._counted:  # data figures once per chunk, not once per epoch/repeat
            self._counted.add(i)
            self.result.coords_present += tz.coords_present
            self.result.coords_reserved += tz.coords_reserved
            for name, n in pre.overflow_dropped.items():
                self.result.overflow_dropped[name] = self.result.overflow_dropped.get(name, 0) + n
        self.ensure_engine()
        if reuse and len(self.chunks) == 1:
            self._cache[i] = tz
        return tz

    def ensure_engine(self) -> None:
        """The engine, once the schema is known (from a checkpoint, or the first chunk's fit)."""
        if self.engine is None and self.schema is not None:
            state = self.p.checkpoint["model"] if self.p.checkpoint else None
            self.engine = compute_stage.Engine(self.spec, self.schema, self.p.device, state, self.clock,
                                               self.enc)

    def prepare_untimed(self, i: int) -> Tensorized:
        """retrieve -> tensorize for chunk ``i`` outside the stage timings (reference pass)."""
        r = retrieve(self.spec, self.p.sources, self.chunks[i])
        return tensorize(self.spec, preprocess(self.spec, r), self.enc, self.schema)

    def train(self) -> None:
        for epoch in range(self.spec.run.epochs):
            before = self.engine.train_timings.updates if self.engine else 0
            for i in range(len(self.chunks)):
                tz = self.prepare(i, reuse=True)
                progress.emit("stage", name="compute", chunk=i, phase="train", epoch=epoch)
                _, sec = compute_task(self.engine, tz, "train", ())
                self.result.stages["compute"].add(sec, int(tz.is_train.sum()))
            if epoch == 0:
                self.result.updates_per_epoch = self.engine.train_timings.updates - before

    def predict(self, writer: PredictionWriter, repeat: int) -> None:
        """One full predict pass (retrieve..write); per-pass figures feed the repeat stats."""
        st = self.result.stages
        e2e_before = self.result.e2e_seconds
        pt = self.engine.predict_timings if self.engine else None
        steady_before = (len(pt.steady_seconds) if pt else 0)
        rows = 0
        for i in range(len(self.chunks)):
            tz = self.prepare(i)
            progress.emit("stage", name="compute", chunk=i, phase="predict", repeat=repeat)
            outs, sec = compute_task(self.engine, tz, "predict", tuple(self.spec.task.outputs))
            st["compute"].add(sec, tz.root_rows)
            progress.emit("stage", name="write", chunk=i)
            st["write"].add(write_task(self.spec, self.engine, self.enc, tz, outs, writer,
                                       self.clock), tz.root_rows)
            rows += tz.root_rows
        self.result.rows_predicted += rows
        pt = self.engine.predict_timings
        secs = sum(pt.steady_seconds[steady_before:])
        if secs > 0:
            self.result.repeat_steady_rows_per_s.append(sum(pt.steady_rows[steady_before:]) / secs)
        self.result.repeat_e2e_rows_per_s.append(rows / max(self.result.e2e_seconds - e2e_before, 1e-12))


@flow(name="benchmark", persist_result=False, validate_parameters=True)
def benchmark(spec: dict[str, Any], spec_dir: str = ".", launched_at: float | None = None,
              parent_run_id: str | None = None, tags: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one benchmark spec end to end and record it in MLflow; returns a summary."""
    flow_start = wall_clock()
    s = parse_spec(spec, "(flow parameter 'spec')")
    progress.emit("phase", name="checking inputs")
    p = plan(s, Path(spec_dir).resolve())
    progress.emit("phase", name="starting MLflow run")
    t0 = wall_clock()
    tracker = Tracker(s.name)
    run_tags = {"relflow.spec_hash": s.spec_hash, "relflow.spec_name": s.name,
                **fingerprint(p.device), **(tags or {})}
    run_id = tracker.start(run_name=f"{s.name}-{s.run.mode}", tags=run_tags,
                           parent_run_id=parent_run_id)
    mlflow_seconds = wall_clock() - t0
    output = Path(s.run.output_dir).resolve() / f"{s.name}-{run_id}.parquet"
    writer = PredictionWriter(output)
    result = RunResult()
    memory = PeakMemory(p.device).start()
    try:
        if s.run.system_metrics_interval_s > 0:
            tracker.start_system_metrics(s.run.system_metrics_interval_s)
        tracker.log_params(flatten(s.to_dict()))
        tracker.log_text(s.to_yaml(), "spec.yaml")
        with host_lock(on_wait=lambda: progress.emit("phase", name="waiting for the host lock")
                       ) as waited:
            body_start = wall_clock()
            region_start_unix = unix_time()
            load_start = host_load_per_core()
            pipe = Pipeline(p, result)
            pipe.list_keys()
            if s.run.mode == "train+predict":
                pipe.train()
            pipe.ensure_engine()
            ckpt_path = None
            if s.run.mode == "train+predict" and s.run.backend == "onnxruntime":
                ckpt_path = output.with_suffix(".ckpt")  # ONNX Runtime serves the trained weights
                ckpt_path.parent.mkdir(parents=True, exist_ok=True)  # the writer makes it later
                save_run_checkpoint(ckpt_path, pipe.engine, pipe.enc, s)
            load = p.checkpoint.get("load") if p.checkpoint else None
            backend_setup, backend_tags = BackendSetup(), {}
            if pipe.engine is not None:
                progress.emit("phase", name=f"starting the {s.run.backend} backend")
                backend_setup, backend_tags = start_backend(
                    s, pipe.engine, p.backend, ckpt_path or (Path(s.run.checkpoint) if s.run.checkpoint else None),
                    load, pipe.clock)
            for repeat in range(s.run.repeats):
                # Every pass really writes; only the last file is kept.
                w = writer if repeat == s.run.repeats - 1 else PredictionWriter(
                    output.with_name(f"{output.stem}.repeat{repeat}.parquet"))
                try:
                    pipe.predict(w, repeat)
                finally:
                    if w is not writer:
                        w.abort()
            body_seconds = wall_clock() - body_start
            region_end_unix = unix_time()
            load_end = host_load_per_core()
            if p.reference is not None:
                progress.emit("phase", name="reference quality (not timed)")
                ref_quality = reference_quality(s, p.reference, pipe.chunks, pipe.prepare_untimed, p.device)
        engine, enc = pipe.engine, pipe.enc
        backend_tags = backend_tags or engine.backend.tags()
        for phase in ("train", "predict"):
            backend_setup.graph_breaks_warmup[phase] = engine.graph_breaks_in_warmup(phase)
        result.extra.update(backend_setup.metrics())
        if load is not None:
            result.extra.update(load.metrics())
        result.extra["compute.compiled_frames"] = float(compute_stage.compiled_frames() - engine.frames_at_start)
        for phase in ("train", "predict"):
            result.recompiles[phase] = engine.recompiles(phase)
            result.graph_breaks[phase] = engine.graph_breaks_after_warmup(phase)
        tracker.stop_system_metrics()
        result.rows_written = writer.rows
        result.output_bytes = writer.commit()
        result.output_path = str(output)
        memory.stop()
        result.host_peak_bytes = memory.host_peak_bytes
        result.device_peak_bytes = memory.device_peak_bytes
        result.train = engine.train_timings if s.run.mode == "train+predict" else None
        result.predict = engine.predict_timings
        result.compute_seconds = engine.wall_seconds
        result.quality = engine.quality.metrics()
        if p.reference is not None:
            result.extra.update(quality_delta(engine.quality.headline, result.quality, ref_quality))
        result.extra.update({
            "harness.data_seconds": p.data_seconds,
            "harness.startup_seconds": (flow_start - launched_at if launched_at else 0.0)
            + mlflow_seconds,
            "harness.mlflow_startup_seconds": mlflow_seconds,
            "harness.orchestration_seconds": max(body_seconds - result.e2e_seconds, 0.0),
            "harness.lock_wait_seconds": waited,
            # When this run held the host: lets anyone check that timed regions never overlap.
            "harness.timed_region_start_unix_s": region_start_unix,
            "harness.timed_region_end_unix_s": region_end_unix,
            # Other work on the host is the biggest source of bad numbers on small machines.
            "host.load_per_core_start": load_start,
            "host.load_per_core_end": load_end,
        })
        quality_meaningful = s.run.mode == "train+predict" or p.checkpoint is not None
        if s.run.mode == "train+predict":
            if ckpt_path is None:
                ckpt_path = output.with_suffix(".ckpt")
                save_run_checkpoint(ckpt_path, engine, enc, s)
            tracker.log_artifact(ckpt_path, "checkpoint")
        shape = inspect_on_meta(engine.schema, engine.model.config,
                                outputs=engine.needed_outputs(tuple(s.task.outputs)))
        tracker.log_params({"model.parameters": shape["parameters"],
                            "model.flops_per_root_row": shape["flops_per_root_row"],
                            "run.resolved_device": str(p.device)})
        # Everything the flow spent besides the five stages (checks, MLflow start, Prefect task
        # orchestration, meta inspection, checkpoint), up to here; final logging comes after.
        result.extra["harness.flow_seconds"] = wall_clock() - flow_start
        result.extra["harness.flow_overhead_seconds"] = result.extra["harness.flow_seconds"] - result.e2e_seconds
        metrics = result.metrics()
        reasons = verdict(s, metrics, engine.quality.headline) + drop_reasons(s, metrics)
        if not quality_meaningful and s.task.min_quality is not None:
            reasons.append("task.min_quality set but weights are untrained (predict without "
                           "run.checkpoint)")
        tracker.log_metrics(metrics)
        tracker.set_tags({
            "relflow.encoder_path": ",".join(sorted(engine.paths_seen)),
            **backend_tags,
            "relflow.graph_break_reasons": json.dumps(compute_stage.graph_break_reasons()),
            "relflow.quality_meaningful": str(quality_meaningful).lower(),
            "relflow.output_path": str(output),
            "relflow.validity": "INVALID" if reasons else "VALID",
            "relflow.invalid_reasons": "; ".join(reasons),
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
    summary = {
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
        "validity": "INVALID" if reasons else "VALID",
        "invalid_reasons": reasons,
    }
    publish_run_artifact(summary)
    return summary


def _sample_csv(path: Path, rows: int = 100) -> str:
    """First rows of the predictions as CSV (nested values shown as text)."""
    table = pq.ParquetFile(path).read_row_group(0).slice(0, rows)
    return pd.DataFrame({name: [str(v) for v in col.to_pylist()] for name, col in zip(
        table.column_names, table.columns, strict=True)}).to_csv(index=False)


