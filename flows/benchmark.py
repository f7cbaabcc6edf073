"""The ``benchmark`` flow: one spec, five timed stages, one MLflow run.

    retrieve -> preprocess -> tensorize -> compute -> write

Root keys are processed in chunks of ``run.chunk_rows`` so memory stays bounded as data
grows; stage times add up over chunks (and over training epochs, which re-read their
chunks as a streaming trainer does, except a single-chunk workload, which keeps its tensors
between epochs). Every predict pass runs all five stages. Training epochs and predict passes
are timed as separate phases (``e2e.train.*``, ``e2e.predict.*``), never summed.

The flow reads as its steps: ``plan`` (checks) -> ``start_run`` -> ``timed_body`` ->
``collect`` -> ``judge`` (validity) -> ``log_run``.

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
from prefect.utilities.annotations import quote

from flows.artifacts import publish_run_artifact
from model.arrow import Encoding
from model.meta import inspect_on_meta
from tasks.backends.checkpoint import load_run_checkpoint, save_run_checkpoint
from tasks.backends.setup import BackendPlan, check_backend, check_backend_settings, start_backend
from tasks.checks.data import check_data_before_work, check_files, check_table_folders
from tasks.checks.preflight import check_before_work
from tasks.distributed import launch as distributed
from tasks.measure import keys as K
from tasks.measure.baseline import no_better_than_baseline
from tasks.measure.clock import Clock, unix_time, wall_clock
from tasks.measure.environment import fingerprint, host_load_per_core
from tasks.measure.hostload import OtherCpu, other_cpu_fraction_before
from tasks.measure.memory import PeakMemory
from tasks.measure.peak import peak_flops
from tasks.measure.profiling import to_markdown as profile_markdown
from tasks.measure.records import PHASES, BackendSetup, RunResult, StageTiming, batch_coordinate_metrics
from tasks.measure.reference import check_reference, drop_reasons, quality_delta, reference_quality
from tasks.measure.stats import CI_METHOD
from tasks.measure.utilisation import mfu_metrics
from tasks.measure.validity import verdict
from tasks.runtime import interrupts, progress
from tasks.runtime.hostlock import host_lock, lock_path
from tasks.runtime.masking import mask_uri
from tasks.runtime.threads import apply_threads
from tasks.runtime.writes import named_write_errors
from tasks.scenarios.latency import verdict as latency_verdict
from tasks.scenarios.runner import run_requests
from tasks.sources.databases import close_all as close_databases
from tasks.sources.databases import kind_of, resolve_database
from tasks.sources.files import SourceTable, check_sources, resolve_sources
from tasks.sources.tpch import ensure_tpch
from tasks.spec import Spec, parse_spec
from tasks.stages import calibrate as calibration
from tasks.stages import compute as compute_stage
from tasks.stages.encode import check_text
from tasks.stages.encode import encode as encode_text
from tasks.stages.preprocess import Preprocessed, preprocess
from tasks.stages.retrieve import Retrieved, list_root_keys, retrieve
from tasks.stages.tensorize import Tensorized, fit, tensorize
from tasks.stages.write import PredictionWriter, to_table
from tasks.tracking.datasets import describe_sources, model_interface
from tasks.tracking.run_note import run_description
from tasks.tracking.store import Tracker, flatten

# Stage tasks carry chunks of data: no cache key (hashing tables costs seconds), no result
# persistence, and every argument is passed in ``quote()`` so Prefect does not walk it
# looking for upstream futures (its per-call cost grows with the size of the arguments).
STAGE_TASK = dict(cache_policy=NO_CACHE, persist_result=False, retries=0)


@task(name="retrieve", **STAGE_TASK)
def retrieve_task(
    spec: Spec, sources: dict[str, SourceTable], keys: np.ndarray, clock: Clock
) -> tuple[Retrieved, float]:
    with clock.measure() as span:
        out = retrieve(spec, sources, keys)
    return out, span.seconds


@task(name="preprocess", **STAGE_TASK)
def preprocess_task(spec: Spec, retrieved: Retrieved, clock: Clock) -> tuple[Preprocessed, float]:
    with clock.measure() as span:
        out = preprocess(spec, retrieved)
    return out, span.seconds


@task(name="encode", **STAGE_TASK)
def encode_task(spec: Spec, pre: Preprocessed, clock: Clock) -> tuple[Preprocessed, int, float]:
    with clock.measure() as span:
        out = encode_text(spec, pre)
    return out.pre, out.cells, span.seconds


@task(name="tensorize", **STAGE_TASK)
def tensorize_task(
    spec: Spec, pre: Preprocessed, enc: Encoding | None, schema: Any, clock: Clock
) -> tuple[Tensorized, Encoding, Any, float]:
    with clock.measure() as span:
        if enc is None:  # no checkpoint: fit on the first chunk's training rows
            enc, schema = fit(spec, pre)
        out = tensorize(spec, pre, enc, schema)
    return out, enc, schema, span.seconds


@task(name="compute", **STAGE_TASK)
def compute_task(
    engine: compute_stage.Engine, tz: Tensorized, phase: str, outputs: tuple[str, ...]
) -> tuple[compute_stage.PredictOutputs | None, float]:
    with engine.clock.measure() as span:
        out = engine.train(tz) if phase == "train" else engine.predict(tz, outputs)
    return out, span.seconds


@task(name="calibrate", **STAGE_TASK)
def calibrate_task(
    outs: compute_stage.PredictOutputs,
    temperature: float,
    kind: str,
    quality: calibration.CalibrationQuality,
    clock: Clock,
) -> tuple[compute_stage.PredictOutputs, float]:
    if outs.label_mask is not None:  # quality bookkeeping, not part of serving: untimed
        quality.add(outs.tensors["prediction"], outs.labels, outs.label_mask)
    with clock.measure() as span:
        out = calibration.calibrate_outputs(outs, temperature, kind)
    return out, span.seconds


@task(name="requests", **STAGE_TASK)
def requests_task(pipe: Pipeline, writer: PredictionWriter) -> Any:
    """single_stream / server: timed requests (tasks/scenarios)."""
    return run_requests(pipe, writer, pipe.calibration)


@task(name="write", **STAGE_TASK)
def write_task(
    spec: Spec,
    engine: compute_stage.Engine,
    enc: Encoding,
    tz: Tensorized,
    outs: compute_stage.PredictOutputs,
    writer: PredictionWriter,
    clock: Clock,
) -> float:
    with clock.measure() as span, named_write_errors(writer.path, "predictions", "run.output_dir"):
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
    spec_dir: Path = Path(".")  # where relative source paths resolve (DDP ranks re-plan from it)
    data_metrics: dict[str, float] = field(default_factory=dict)  # tasks/checks/data.py counts
    warnings: list[str] = field(default_factory=list)
    backend: BackendPlan = field(default_factory=BackendPlan)  # run.backend (tasks/backends)
    reference: dict[str, Any] | None = None  # run.reference_checkpoint, loaded and checked


def plan(spec: Spec, spec_dir: Path) -> Plan:
    """Validate inputs and make the data available; raises ``UserError`` before any work.

    The returned ``Plan.spec`` reserves at most the data's observed rows per parent in each
    branch (tasks/checks/data.py); the run's params and spec hash stay the configured spec's."""
    t0 = wall_clock()
    notes = check_before_work(spec)  # tracking store, output folder, device name, stale runs
    check_backend_settings(spec)  # e.g. an execution provider this onnxruntime build lacks
    check_text(spec)  # a plug-in text encoder loads: settings first, the data scans after
    generated = False
    base = spec_dir
    db = spec.source.database
    if spec.source.generate is not None and (db is None or kind_of(db.url) == "duckdb"):
        base, generated = ensure_tpch(spec.source.generate.tpch.scale)
    if db is not None:  # tables in a database (tasks/sources/databases.py) instead of files
        sources = resolve_database(spec, spec_dir, base if spec.source.generate else None)
    else:
        check_table_folders(spec, base)  # "holds no data files", not "does not exist"
        sources = resolve_sources(spec, base)
        check_files(spec, sources)  # corrupt files and folders of mixed types, named
    check_sources(spec, sources)
    # keys, duplicates, non-finite values, target, memory; the run uses the reserved lengths
    spec, data_metrics, data_notes = check_data_before_work(spec, sources)
    device = compute_stage.resolve_device(spec)
    compute_stage.check_precision(spec, device)
    distributed.check(spec, device)
    ckpt = None
    if spec.run.checkpoint:  # predict: its weights; train+predict: resume (settings checked)
        ckpt = load_run_checkpoint(Path(spec.run.checkpoint), spec)
    backend, ckpt = check_backend(spec, ckpt)  # providers, bundle (it may stand in for ckpt)
    reference = check_reference(spec, ckpt["encoding"] if ckpt else None)
    return Plan(
        spec,
        sources,
        device,
        ckpt,
        wall_clock() - t0,
        generated,
        spec_dir,
        data_metrics,
        notes + data_notes,
        backend,
        reference,
    )


class Pipeline:
    """Runs the chunked stages for one plan and accumulates into one ``RunResult``.

    Every stage second is charged to the phase that spent it (train epochs or predict
    passes); the root-key listing, once per run, is charged to predict's retrieve."""

    def __init__(self, p: Plan, result: RunResult) -> None:
        self.p, self.spec, self.result = p, p.spec, result
        self.clock = Clock(p.device)
        self.enc: Encoding | None = p.checkpoint["encoding"] if p.checkpoint else None
        self.schema = p.checkpoint["schema"] if p.checkpoint else None
        # Output calibration: fitted after training, else the checkpoint's (1.0 = none).
        self.temperature: float = p.checkpoint.get("temperature", 1.0) if p.checkpoint else 1.0
        self.calibration = calibration.CalibrationQuality(self.spec.task.kind, self.temperature)
        self.engine: compute_stage.Engine | None = None
        self.engine_setup_seconds = 0.0
        self.chunks: list[np.ndarray] = []
        self._cache: dict[int, Tensorized] = {}
        self._counted: set[int] = set()
        self.has_text = any(
            k == "text"
            for c in [self.spec.schema_.root.columns] + [b.columns for b, _ in self.spec.schema_.walk()]
            for k in c.values()
        )
        if self.has_text:  # the application's text encoder: an extra timed step, before tensorize
            for phase, st in result.stages.items():
                result.stages[phase] = (
                    {k: st[k] for k in ("retrieve", "preprocess")}
                    | {"encode": StageTiming("encode", phase)}
                    | {k: v for k, v in st.items() if k not in ("retrieve", "preprocess")}
                )
            self.text_cells = self.text_cells_per_pass = 0

    def list_keys(self) -> None:
        with self.clock.measure() as span:
            keys, nbytes = list_root_keys(self.spec, self.p.sources)
        self.result.stages["predict"]["retrieve"].add(span.seconds, 0)
        self.result.bytes_read += nbytes
        self.result.root_rows = len(keys)
        n = self.spec.run.chunk_rows
        self.chunks = [keys[i : i + n] for i in range(0, len(keys), n)]
        self.result.chunks = len(self.chunks)

    def prepare(self, i: int, phase: str, reuse: bool = False) -> Tensorized:
        """retrieve -> preprocess -> tensorize for chunk ``i``, charged to ``phase``.

        With ``reuse`` (training epochs) a single-chunk workload keeps its tensors instead of
        re-reading each epoch; predict passes always run every stage, so each pass is a full,
        comparable measurement of the serving path."""
        if reuse and i in self._cache:
            return self._cache[i]
        spec, st, clock = self.spec, self.result.stages[phase], self.clock
        progress.emit("stage", name="retrieve", chunk=i)
        r, sec = retrieve_task(quote(spec), quote(self.p.sources), quote(self.chunks[i]), quote(clock))
        st["retrieve"].add(sec, r.root_rows)
        self.result.bytes_read += r.bytes_read
        self.result.extra[K.DATA_ROWS_READ] = self.result.extra.get(K.DATA_ROWS_READ, 0.0) + sum(r.rows_read.values())
        progress.emit("stage", name="preprocess", chunk=i)
        pre, sec = preprocess_task(quote(spec), quote(r), quote(clock))
        st["preprocess"].add(sec, pre.root_rows)
        if self.has_text:
            progress.emit("stage", name="encode", chunk=i)
            pre, cells, sec = encode_task(quote(spec), quote(pre), quote(clock))
            st["encode"].add(sec, pre.root_rows)
            self.text_cells += cells  # every call, for encode.cells_per_s
            if i not in self._counted:
                self.text_cells_per_pass += cells
        progress.emit("stage", name="tensorize", chunk=i)
        tz, self.enc, self.schema, sec = tensorize_task(
            quote(spec), quote(pre), quote(self.enc), quote(self.schema), quote(clock)
        )
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
        """The engine, once the schema is known (from a checkpoint or bundle, or the first
        chunk's fit)."""
        if self.engine is None and self.schema is not None:
            ck = self.p.checkpoint
            start = wall_clock()
            self.engine = compute_stage.Engine(
                self.spec,
                self.schema,
                self.p.device,
                ck["model"] if ck else None,
                self.clock,
                self.enc,
                optimizer_state=ck.get("optimizer") if ck else None,
            )
            # model set-up, not orchestration: kept out of harness.orchestration_seconds
            self.engine_setup_seconds = wall_clock() - start

    def prepare_untimed(self, i: int) -> Tensorized:
        """retrieve -> (encode) -> tensorize for chunk ``i`` outside the stage timings (the
        reference pass); the same stage functions, without Prefect tasks or stage seconds."""
        assert self.enc is not None
        pre = preprocess(self.spec, retrieve(self.spec, self.p.sources, self.chunks[i]))
        if self.has_text:
            pre = encode_text(self.spec, pre).pre
        return tensorize(self.spec, pre, self.enc, self.schema)

    def train(self) -> None:
        st = self.result.stages["train"]
        for epoch in range(self.spec.run.epochs):
            before = self.engine.train_timings.updates if self.engine else 0
            for i in range(len(self.chunks)):
                tz = self.prepare(i, "train", reuse=True)
                progress.emit("stage", name="compute", chunk=i, phase="train", epoch=epoch)
                _, sec = compute_task(quote(self.engine), quote(tz), "train", ())
                st["compute"].add(sec, int(tz.is_train.sum()))
            if epoch == 0:
                self.result.updates_per_epoch = self.engine.train_timings.updates - before
            self.result.train_epochs += 1

    def fit_calibration(self) -> None:
        """Temperature scaling on the validation split, after training (not a stage)."""
        with self.clock.measure() as span:
            self.temperature, rows = calibration.fit_on_validation(self)
        self.calibration.temperature = self.temperature
        if self.engine is not None:
            self.engine.temperature = self.temperature  # saved with the checkpoint
        self.result.extra.update({"calibration.fit_seconds": span.seconds, "calibration.fit_rows": float(rows)})

    def predict(self, writer: PredictionWriter, repeat: int) -> None:
        """One full predict pass (retrieve..write); per-pass figures feed the repeat stats."""
        st = self.result.stages["predict"]
        pass_start = self.result.e2e_seconds("predict")
        pt = self.engine.predict_timings if self.engine else None
        steady_before = len(pt.steady_seconds) if pt else 0
        if self.engine is not None:  # (a new engine starts with empty quality)
            self.engine.begin_predict_pass()
        rows = 0
        for i in range(len(self.chunks)):
            tz = self.prepare(i, "predict")
            progress.emit("stage", name="compute", chunk=i, phase="predict", repeat=repeat)
            outs, sec = compute_task(quote(self.engine), quote(tz), "predict", tuple(self.spec.task.outputs))
            st["compute"].add(sec, tz.root_rows)
            outs, sec = calibrate_task(outs, self.temperature, self.spec.task.kind, self.calibration, self.clock)
            st["calibrate"].add(sec, tz.root_rows)
            progress.emit("stage", name="write", chunk=i)
            st["write"].add(
                write_task(
                    quote(self.spec),
                    quote(self.engine),
                    quote(self.enc),
                    quote(tz),
                    quote(outs),
                    quote(writer),
                    quote(self.clock),
                ),
                tz.root_rows,
            )
            rows += tz.root_rows
        self.result.rows_predicted += rows
        self.result.predict_passes += 1
        pt = self.engine.predict_timings
        secs = sum(pt.steady_seconds[steady_before:])
        if secs > 0:
            self.result.repeat_steady_rows_per_s.append(sum(pt.steady_rows[steady_before:]) / secs)
        pass_seconds = self.result.e2e_seconds("predict") - pass_start
        self.result.repeat_predict_rows_per_s.append(rows / max(pass_seconds, 1e-12))


@dataclass
class Run:
    """One benchmark invocation's state, handed from step to step."""

    spec: Spec
    plan: Plan
    tracker: Tracker
    run_id: str
    output: Path
    writer: PredictionWriter
    result: RunResult
    memory: PeakMemory
    flow_start: float
    launch_seconds: float  # from the CLI's launch to the flow's start (Prefect start-up)
    mlflow_seconds: float
    pipe: Pipeline | None = None
    region: dict[str, float] | None = None
    ckpt_path: Path | None = None
    latency: Any = None  # LatencyRecord of a single_stream / server run
    backend_setup: BackendSetup = field(default_factory=BackendSetup)
    backend_tags: dict[str, str] = field(default_factory=dict)
    reference_quality: dict[str, float] | None = None

    @property
    def quality_meaningful(self) -> bool:
        return self.spec.run.mode == "train+predict" or self.plan.checkpoint is not None


def start_run(
    s: Spec,
    p: Plan,
    flow_start: float,
    launched_at: float | None,
    parent_run_id: str | None,
    tags: dict[str, str] | None,
    thread_tags: dict[str, str] | None = None,
) -> Run:
    """Step 1: the MLflow run (tags, params, spec), the output file and the memory sampler."""
    t0 = wall_clock()
    tracker = Tracker(s.name)
    run_tags = {
        "relflow.spec_hash": s.spec_hash,
        "relflow.spec_name": s.name,
        "relflow.ci_method": CI_METHOD,
        **fingerprint(p.device),
        **(thread_tags or {}),
        **(tags or {}),
    }
    run_id = tracker.start(run_name=f"{s.name}-{s.run.mode}", tags=run_tags, parent_run_id=parent_run_id)
    mlflow_seconds = wall_clock() - t0
    output = Path(s.run.output_dir).resolve() / f"{s.name}-{run_id}.parquet"
    return Run(
        s,
        p,
        tracker,
        run_id,
        output,
        PredictionWriter(output),
        RunResult(),
        PeakMemory(p.device),
        flow_start,
        flow_start - launched_at if launched_at else 0.0,
        mlflow_seconds,
    )


def timed_body(run: Run) -> None:
    """Step 2: under the host lock, the timed region: list keys, train epochs, predict passes.

    Other work on the host is sampled just before the region (the benchmark idle) and
    measured during it; MLflow system metrics are only sampled in memory here."""
    s = run.spec
    run.tracker.log_params(flatten(s.to_dict()))
    run.tracker.log_text(s.to_yaml(), "spec.yaml")
    run.tracker.log_datasets(describe_sources(s, run.plan.sources))
    with host_lock(on_wait=lambda: progress.emit("phase", name=f"waiting for the host lock {lock_path()}")) as waited:
        load_start = host_load_per_core()
        other_before = other_cpu_fraction_before()
        if s.run.system_metrics_interval_s > 0:
            run.tracker.start_system_metrics(s.run.system_metrics_interval_s)
        other = OtherCpu().start()
        body_start = wall_clock()
        region_start_unix = unix_time()
        run.pipe = pipe = Pipeline(run.plan, run.result)
        pipe.list_keys()
        if s.run.mode == "train+predict":
            if s.run.distributed:  # DDP ranks under torchrun (tasks/distributed/launch.py)
                distributed.train(pipe, run.plan.spec_dir, run.run_id, s.name, run.tracker.uri)
            else:
                pipe.train()
            pipe.fit_calibration()
        setup_seconds = serving_backend(run)  # outside every stage (not in e2e)
        run.latency = None
        if s.run.scenario != "offline":  # single_stream / server (tasks/scenarios)
            progress.emit("phase", name=f"{s.run.scenario} requests")
            run.latency = requests_task(pipe, run.writer)
        for repeat in range(s.run.repeats if run.latency is None else 0):
            # Every pass really writes; only the last file is kept.
            w = (
                run.writer
                if repeat == s.run.repeats - 1
                else PredictionWriter(run.output.with_name(f"{run.output.stem}.repeat{repeat}.parquet"))
            )
            try:
                pipe.predict(w, repeat)
            finally:
                if w is not run.writer:
                    w.abort()
        body_seconds = wall_clock() - body_start
        region_end_unix = unix_time()
        other_during = other.stop()
        run.tracker.stop_system_metrics()
        if run.plan.reference is not None:  # still under the host lock, after the region
            progress.emit("phase", name="reference quality (not timed)")
            run.reference_quality = reference_quality(
                s, run.plan.reference, pipe.chunks, pipe.prepare_untimed, run.plan.device
            )
    run.region = {
        "waited": waited,
        "body_seconds": body_seconds,
        "setup_seconds": setup_seconds,
        "start_unix": region_start_unix,
        "end_unix": region_end_unix,
        "load_start": load_start,
        "other_before": other_before,
        "other_during": other_during,
    }


def serving_backend(run: Run) -> float:
    """Between training and the first predict pass: the backend the run serves with
    (tasks/backends). ONNX Runtime after training exports the run's own checkpoint, saved
    here first. Returns the seconds it took (export, session, checkpoint), kept out of e2e and
    of the orchestration figure."""
    s, pipe = run.spec, run.pipe
    assert pipe is not None
    pipe.ensure_engine()  # its own figure, harness.engine_setup_seconds
    start = wall_clock()
    if pipe.engine is None:  # predict with untrained weights: schema known after the first fit
        return 0.0
    served = Path(s.run.checkpoint) if s.run.checkpoint else None
    if s.run.mode == "train+predict" and s.run.backend == "onnxruntime":
        assert pipe.enc is not None
        run.ckpt_path = served = run.output.with_suffix(".ckpt")  # ONNX Runtime serves the trained weights
        served.parent.mkdir(parents=True, exist_ok=True)  # the writer creates it only when committing
        save_run_checkpoint(served, pipe.engine, pipe.enc, s)
    load = run.plan.checkpoint.get("load") if run.plan.checkpoint else None
    progress.emit("phase", name=f"starting the {s.run.backend} backend")
    run.backend_setup, run.backend_tags = start_backend(s, pipe.engine, run.plan.backend, served, load, pipe.clock)
    return wall_clock() - start


def collect(run: Run) -> dict[str, float]:
    """Step 3: engine and harness figures into the result, predictions committed, checkpoint
    saved; returns the metrics."""
    s, p, result, region = run.spec, run.plan, run.result, run.region
    engine, enc = run.pipe.engine, run.pipe.enc
    result.extra[K.COMPILED_FRAMES] = float(compute_stage.compiled_frames() - engine.frames_at_start)
    result.extra.update(batch_coordinate_metrics(engine.batch_coords, s.run.repeats, len(engine.batch_shapes)))
    if run.pipe.has_text:
        enc_s = sum(st["encode"].seconds for st in result.stages.values())
        result.extra[K.DATA_TEXT_CELLS] = float(run.pipe.text_cells_per_pass)
        result.extra[K.ENCODE_CELLS_PER_S] = run.pipe.text_cells / enc_s if enc_s > 0 else 0.0
    for phase in PHASES:
        result.recompiles[phase] = engine.recompiles(phase)
        result.graph_breaks[phase] = engine.graph_breaks_after_warmup(phase)
        run.backend_setup.graph_breaks_warmup[phase] = engine.graph_breaks_in_warmup(phase)
    result.extra.update(run.backend_setup.metrics())
    load = p.checkpoint.get("load") if p.checkpoint else None
    if load is not None:
        result.extra.update(load.metrics())
    engine.close()
    engine.profiler.close()
    result.rows_written = run.writer.rows
    with named_write_errors(run.writer.path, "predictions", "run.output_dir"):
        result.output_bytes = run.writer.commit()
    result.output_path = str(run.output)
    run.memory.stop()
    result.host_peak_bytes = run.memory.host_peak_bytes
    result.host_peak_excluding_compiler_bytes = run.memory.host_peak_excluding_compiler_bytes
    result.device_peak_bytes = run.memory.device_peak_bytes
    result.train = engine.train_timings if s.run.mode == "train+predict" else None
    result.predict = engine.predict_timings
    result.compute_seconds = engine.wall_seconds
    result.worker_startup_seconds = engine.worker_startup_seconds
    result.quality = engine.quality.metrics()
    result.quality.update(run.pipe.calibration.metrics())
    result.extra["calibration.temperature"] = run.pipe.temperature
    if run.reference_quality is not None:
        result.extra.update(quality_delta(engine.quality.headline, result.quality, run.reference_quality))
    if run.latency is not None:
        result.extra.update(run.latency.metrics())
    result.extra.update(
        {
            K.HARNESS_DATA_SECONDS: p.data_seconds,
            K.HARNESS_STARTUP_SECONDS: run.launch_seconds + run.mlflow_seconds,
            K.HARNESS_MLFLOW_STARTUP_SECONDS: run.mlflow_seconds,
            K.HARNESS_ORCHESTRATION_SECONDS: max(
                region["body_seconds"]
                - region["setup_seconds"]
                - run.pipe.engine_setup_seconds
                - result.timed_stage_seconds,
                0.0,
            ),
            K.HARNESS_ENGINE_SETUP_SECONDS: run.pipe.engine_setup_seconds,
            K.HARNESS_LOCK_WAIT_SECONDS: region["waited"],
            # When this run held the host: lets anyone check that timed regions never overlap.
            K.HARNESS_REGION_START: region["start_unix"],
            K.HARNESS_REGION_END: region["end_unix"],
            # Other work on the host is the biggest source of bad numbers on small machines.
            K.HOST_LOAD_PER_CORE_START: region["load_start"],
            K.HOST_OTHER_CPU_FRACTION_BEFORE: region["other_before"],
            K.HOST_OTHER_CPU_FRACTION: region["other_during"],
        }
    )
    if s.run.mode == "train+predict":
        if run.ckpt_path is None:  # else saved before serving (ONNX Runtime exports it)
            run.ckpt_path = run.output.with_suffix(".ckpt")
            save_run_checkpoint(run.ckpt_path, engine, enc, s)
        run.tracker.log_artifact(run.ckpt_path, "checkpoint")
        run.tracker.log_model(
            engine.model,
            model_interface(
                s, p.sources, engine.schema, engine.model.config, engine.needed_outputs(tuple(s.task.outputs))
            ),
        )
    shape = inspect_on_meta(engine.schema, engine.model.config, outputs=engine.needed_outputs(tuple(s.task.outputs)))
    run.tracker.log_params(
        {
            "model.parameters": shape["parameters"],
            "model.flops_per_root_row": shape["flops_per_root_row"],
            "run.resolved_device": str(p.device),
        }
    )
    result.extra.update(_utilisation(s, p, engine, result, shape))
    # Everything the flow spent besides the five stages (checks, MLflow start, Prefect task
    # orchestration, meta inspection, checkpoint), up to here; final logging comes after.
    flow_seconds = wall_clock() - run.flow_start
    result.extra[K.HARNESS_FLOW_SECONDS] = flow_seconds
    result.extra[K.HARNESS_FLOW_OVERHEAD_SECONDS] = flow_seconds - result.timed_stage_seconds
    return result.metrics()


def judge(run: Run, metrics: dict[str, float]) -> list[str]:
    """Step 4: the validity verdict (empty: VALID)."""
    reasons = verdict(run.spec, metrics, run.pipe.engine.quality.headline)
    if run.latency is not None:
        reasons += latency_verdict(run.spec.run.scenario, run.spec.run.request, metrics)
    if not run.quality_meaningful and run.spec.task.min_quality is not None:
        reasons.append("task.min_quality set but weights are untrained (predict without run.checkpoint)")
    if run.quality_meaningful:  # a model no better than the majority class / the mean
        reasons += no_better_than_baseline(metrics)
    return reasons + drop_reasons(run.spec, metrics)


def log_run(run: Run, metrics: dict[str, float], reasons: list[str]) -> dict[str, Any]:
    """Step 5: metrics, system metrics, tags and artifacts to MLflow; the run FINISHED.
    Returns the flow's summary."""
    engine, tracker = run.pipe.engine, run.tracker
    tracker.log_metrics(metrics)
    metrics.update(engine.flush_throughput(tracker))  # the callback logs its own estimate
    if run.latency is not None:  # the latency CDF: percentile 0..100 as the metric's steps
        tracker.log_metric_steps("latency.cdf_ms", run.latency.cdf_ms())
    tracker.flush_system_metrics()
    tracker.set_tags(
        {
            "relflow.encoder_path": ",".join(sorted(engine.paths_seen)),
            **(run.backend_tags or engine.backend.tags()),
            "relflow.graph_break_reasons": json.dumps(compute_stage.graph_break_reasons()),
            "relflow.quality_meaningful": str(run.quality_meaningful).lower(),
            "relflow.output_path": str(run.output),
            "relflow.validity": "INVALID" if reasons else "VALID",
            "relflow.invalid_reasons": "; ".join(reasons),
        }
    )
    profile = _log_profile(tracker, engine)
    stage_table = run.result.stage_table()
    tracker.log_dict(stage_table, "stages.json")
    tracker.log_text(_sample_csv(run.output), "predictions_sample.csv")
    tracker.set_description(
        run_description(run.spec.name, stage_table, metrics, reasons, engine.quality.headline, run.quality_meaningful)
    )
    tracker.finish()
    return {
        "run_id": run.run_id,
        "experiment": run.spec.name,
        "experiment_id": tracker.experiment_id,
        "tracking_uri": mask_uri(tracker.uri),  # printed, in --json and the Prefect artifact
        "metrics": metrics,
        "stages": stage_table,
        "output_path": str(run.output),
        "checkpoint_path": str(run.ckpt_path) if run.ckpt_path else None,
        "quality_meaningful": run.quality_meaningful,
        "quality_metric": engine.quality.headline,
        "generated_data": run.plan.generated,
        "encoder_path": ",".join(sorted(engine.paths_seen)),
        "validity": "INVALID" if reasons else "VALID",
        "invalid_reasons": reasons,
        "profile": profile,
    }


@flow(name="benchmark", persist_result=False, validate_parameters=True)
def benchmark(
    spec: dict[str, Any],
    spec_dir: str = ".",
    launched_at: float | None = None,
    parent_run_id: str | None = None,
    tags: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run one benchmark spec end to end and record it in MLflow; returns a summary.

    check inputs -> start run -> timed body -> collect -> verdict -> log."""
    flow_start = wall_clock()
    interrupts.reinstall()  # Prefect's engine took SIGTERM; the CLI's handler ends runs KILLED
    s = parse_spec(spec, "(flow parameter 'spec')")
    thread_tags = apply_threads(s.run.threads.intra_op, s.run.threads.inter_op)
    progress.emit("phase", name="checking inputs")
    p = plan(s, Path(spec_dir).resolve())
    progress.emit("phase", name="starting MLflow run")
    run = start_run(s, p, flow_start, launched_at, parent_run_id, tags, thread_tags)
    forget_outputs = interrupts.on_interrupt(lambda: _remove_outputs(run.output))
    run.result.extra.update(p.data_metrics)
    run.memory.start()
    try:
        timed_body(run)
        metrics = collect(run)
        summary = log_run(run, metrics, judge(run, metrics))
    except BaseException as err:
        try:
            run.memory.stop()
            if run.pipe is not None and run.pipe.engine is not None:
                run.pipe.engine.close()
            run.writer.abort()
            _remove_outputs(run.output)  # a committed prediction file or checkpoint included
        finally:  # a cleanup that raises (a full disk) must neither leave the run RUNNING nor hide err
            run.tracker.fail(err)
            raise err  # noqa: B012
    finally:
        forget_outputs()
        close_databases()
    publish_run_artifact(summary)
    return summary


def _remove_outputs(output: Path) -> None:
    """A run that did not finish leaves none of its files: predictions, checkpoint, temps."""
    for path in (output, output.with_suffix(".ckpt")):
        path.unlink(missing_ok=True)
    if output.parent.is_dir():
        for tmp in output.parent.glob(f".{output.stem}*.tmp-*"):
            tmp.unlink(missing_ok=True)


def _utilisation(
    s: Spec, p: Plan, engine: compute_stage.Engine, result: RunResult, shape: dict[str, int]
) -> dict[str, float]:
    """MFU per phase against this host's cached peak (measured here, outside the timed
    region, on a cache miss)."""
    peak = peak_flops(fingerprint(p.device)["relflow.host_fingerprint"], p.device, s.run.precision)
    phases = {"predict": (float(shape["flops_per_root_row"]), result.predict.steady_rows_per_s)}
    if result.train is not None:
        train_shape = inspect_on_meta(engine.schema, engine.model.config, outputs=("prediction",))
        phases["train"] = (float(train_shape["flops_per_root_row"]), result.train.steady_rows_per_s)
    return {**mfu_metrics(peak.flops_per_s, phases), K.HOST_PEAK_CACHED: float(peak.cached)}


def _log_profile(tracker: Tracker, engine: compute_stage.Engine) -> dict[str, list[dict[str, Any]]]:
    """Traces and top-ops tables as artifacts (``profile/``); the run is tagged profiled."""
    prof = engine.profiler
    if not prof.enabled:
        return {}
    for path in prof.traces.values():
        tracker.log_artifact(path, "profile")
    tracker.log_dict(prof.top_ops, "profile/top_ops.json")
    tracker.log_text(
        "\n\n".join(f"## {phase}\n\n{profile_markdown(rows)}" for phase, rows in prof.top_ops.items()),
        "profile/top_ops.md",
    )
    tracker.set_tags({"relflow.profiled": "true", "relflow.profiled_batches": str(prof.batches)})
    return {phase: rows[:10] for phase, rows in prof.top_ops.items()}


def _sample_csv(path: Path, rows: int = 100) -> str:
    """First rows of the predictions as CSV (nested values shown as text)."""
    table = pq.ParquetFile(path).read_row_group(0).slice(0, rows)
    return pd.DataFrame(
        {name: [str(v) for v in col.to_pylist()] for name, col in zip(table.column_names, table.columns, strict=True)}
    ).to_csv(index=False)
