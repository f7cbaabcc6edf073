"""The ``benchmark`` flow: one spec, five timed stages, one MLflow run.

    retrieve -> preprocess -> tensorize -> compute -> write

The flow reads as its steps: ``plan`` (checks, tasks/checks/plan.py) -> ``start_run`` -> ``timed_body`` ->
``collect`` -> ``judge`` (validity) -> ``log_run``. The work itself is not here: the plan's
stage chain (tasks/stages/chain.py) owns the order of steps, the workload
(tasks/scenarios/workload.py) its chunks, training epochs and calibration fit, and the
scenarios (tasks/scenarios: offline passes, single_stream, server) the predict phase. The
flow hands the chain a runner that makes each step a Prefect task (``NO_CACHE``: hashing
tables costs seconds), timed inside the task with the shared clock, never with Prefect's
records. Training epochs and predict passes are separate phases (``e2e.train.*``,
``e2e.predict.*``), never summed.

Every check that can fail on user input runs before the MLflow run starts. After that, any
error ends the run FAILED (KILLED for interrupts) and removes the partial prediction file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import pandas as pd
import pyarrow.parquet as pq
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from flows.artifacts import publish_run_artifact
from flows.floors import run_floor_metrics
from tasks.backends.served import fp8_metrics
from tasks.backends.setup import serving_backend
from tasks.checks.plan import Plan, plan
from tasks.distributed import launch as distributed
from tasks.libraries import library_for, library_tags
from tasks.measure import keys as K
from tasks.measure.baseline import no_better_than_baseline
from tasks.measure.clock import Clock, unix_time, wall_clock
from tasks.measure.collect import Region, engine_figures, utilisation
from tasks.measure.environment import fingerprint, host_load_per_core
from tasks.measure.floor_trust import UNTRUSTED_TAG, untrusted
from tasks.measure.host_env import CpuTicks, steal_fraction
from tasks.measure.hostload import OtherCpu, other_cpu_fraction_before
from tasks.measure.memory import PeakMemory
from tasks.measure.profiling import to_markdown as profile_markdown
from tasks.measure.records import PHASES, BackendSetup, RunResult
from tasks.measure.reference import drop_reasons, quality_delta, reference_quality
from tasks.measure.stats import CI_METHOD
from tasks.measure.utilisation import utilisation_reasons
from tasks.measure.validity import verdict
from tasks.runtime import interrupts, progress
from tasks.runtime.hostlock import host_lock, lock_path
from tasks.runtime.masking import mask_uri
from tasks.runtime.threads import apply_threads
from tasks.runtime.writes import named_write_errors
from tasks.scenarios.latency import LatencyRecord
from tasks.scenarios.latency import verdict as latency_verdict
from tasks.scenarios.outputs import OutputCheck, check_offline_outputs, check_outputs
from tasks.scenarios.region import RegionSteps, run_region
from tasks.scenarios.runner import run_requests
from tasks.scenarios.workload import Workload
from tasks.sources.databases import close_all as close_databases
from tasks.spec import Spec, parse_spec
from tasks.stages.chain import Chain, Weights
from tasks.stages.compute import Engine
from tasks.stages.engine import EngineBase, graph_break_reasons
from tasks.stages.write import PredictionWriter
from tasks.tracking.datasets import describe_sources, model_interface
from tasks.tracking.run_note import run_description
from tasks.tracking.traces import log_request_traces
from tasks.tracking.writer import Tracker, flatten

_T = TypeVar("_T")

# Stage tasks carry chunks of data: no cache key (hashing tables costs seconds), no result
# persistence, and every argument is passed in ``quote()`` so Prefect does not walk it
# looking for upstream futures (its per-call cost grows with the size of the arguments).
STAGE_TASK = dict(cache_policy=NO_CACHE, persist_result=False, retries=0)


def _run_step(step: Callable[[], Any], clock: Clock) -> tuple[Any, float]:
    with clock.measure() as span:
        out = step()
    return out, span.seconds


# One Prefect task per chain step (retrieve, preprocess, encode, tensorize, compute,
# calibrate, write): the chain (tasks/stages/chain.py) decides the order, Prefect records it.
_STAGE_TASKS = {
    name: task(name=name, **STAGE_TASK)(_run_step)
    for name in ("retrieve", "preprocess", "encode", "tensorize", "compute", "calibrate", "write")
}


def run_as_prefect_task(stage: str, step: Callable[[], _T], clock: Clock) -> tuple[_T, float]:
    """The chain's ``StageRunner`` in the flow: each step a Prefect task, timed inside it."""
    out, seconds = _STAGE_TASKS[stage](quote(step), quote(clock))
    return cast(_T, out), seconds


@task(name="requests", **STAGE_TASK)
def requests_task(work: Workload, writer: PredictionWriter) -> LatencyRecord:
    """single_stream / server: timed requests (tasks/scenarios)."""
    return run_requests(work, writer)


@dataclass(kw_only=True)
class Invocation:
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
    work: Workload | None = None
    region: Region | None = None
    buckets: dict[str, float] = field(default_factory=dict)  # the timed region by bucket (harness.*)
    gc_pauses: dict[str, float] = field(default_factory=dict)  # collector pauses inside it (no bucket)
    ckpt_path: Path | None = None
    latency: LatencyRecord | None = None  # a single_stream / server run's
    backend_setup: BackendSetup = field(default_factory=BackendSetup)
    backend_tags: dict[str, str] = field(default_factory=dict)
    reference_quality: dict[str, float] | None = None
    output_check: OutputCheck | None = None  # run.check_outputs (offline)

    @property
    def quality_meaningful(self) -> bool:
        trained = self.plan.checkpoint is not None or (  # a library's checkpoint is its own to load
            self.spec.model.library != "reference" and self.spec.run.checkpoint is not None
        )
        return self.spec.run.mode == "train+predict" or trained


def start_run(
    s: Spec,
    p: Plan,
    flow_start: float,
    launched_at: float | None,
    parent_run_id: str | None,
    tags: dict[str, str] | None,
    thread_tags: dict[str, str] | None = None,
) -> Invocation:
    """Step 1: the MLflow run (tags, params, spec), the output file and the memory sampler."""
    t0 = wall_clock()
    tracker = Tracker(s.name)
    run_tags = {
        "relflow.spec_hash": s.spec_hash,
        "relflow.spec_name": s.name,
        "relflow.ci_method": CI_METHOD,
        **fingerprint(p.device),
        **library_tags(library_for(s)),  # the model under test and its version
        **(thread_tags or {}),
        **(tags or {}),
    }
    run_id = tracker.start(run_name=f"{s.name}-{s.run.mode}", tags=run_tags, parent_run_id=parent_run_id)
    mlflow_seconds = wall_clock() - t0
    output = Path(s.run.output_dir).resolve() / f"{s.name}-{run_id}.parquet"
    return Invocation(
        spec=s,
        plan=p,
        tracker=tracker,
        run_id=run_id,
        output=output,
        writer=PredictionWriter(output),
        result=RunResult(),
        memory=PeakMemory(p.device),
        flow_start=flow_start,
        launch_seconds=flow_start - launched_at if launched_at else 0.0,
        mlflow_seconds=mlflow_seconds,
    )


def timed_body(run: Invocation) -> None:
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
        ticks_start = CpuTicks.now()
        region_start_unix = unix_time()
        run.work = work = Workload(chain_for(run.plan), run.result)

        def requests() -> LatencyRecord:
            progress.emit("phase", name=f"{s.run.scenario} requests")
            return requests_task(work, run.writer)

        steps = RegionSteps(
            train=lambda: (
                distributed.train(work, run.plan.spec_dir, run.run_id, s.name, run.tracker.uri)
                if s.run.distributed
                else work.train()
            ),
            distributed=s.run.distributed is not None,
            serving_backend=lambda: serve_backend(run),  # outside every stage (not in e2e)
            requests=requests if s.run.scenario != "offline" else None,  # single_stream / server
            writer=run.writer,  # offline: predict passes (tasks/scenarios/offline.py)
        )
        region, run.latency = run_region(work, steps, train=s.run.mode == "train+predict", repeats=s.run.repeats)
        region_end_unix = unix_time()
        other_during = other.stop()
        stolen = steal_fraction(ticks_start, CpuTicks.now())
        run.tracker.stop_system_metrics()
        if run.latency is not None and run.latency.served_outputs is not None:  # under the lock, after the region
            progress.emit("phase", name="output check (not timed)")
            run.latency.output_check = check_outputs(work.chain, run.latency.served_outputs, s.run)
            run.latency.served_outputs = None  # the served tensors are no longer needed
        if work.served_outputs is not None:  # run.check_outputs (offline): under the lock, after the region
            progress.emit("phase", name="output check vs a plain pass (not timed)")
            run.output_check = check_offline_outputs(work.chain, work.served_outputs)
            work.served_outputs = None
        if run.plan.reference is not None:  # still under the host lock, after the region
            progress.emit("phase", name="reference quality (not timed)")
            run.reference_quality = reference_quality(
                s,
                run.plan.reference,
                len(work.chunks),
                work.prepare_untimed,
                run.plan.device,
                # a request scenario: the rows its requests scored, repeats and the cold one included
                run.latency.scored_keys if run.latency is not None else None,
                work.chain.prepare_untimed,
            )
    run.buckets = region.metrics()
    run.gc_pauses = region.gc.metrics()
    run.region = Region(waited, region_start_unix, region_end_unix, load_start, other_before, other_during, stolen)


def chain_for(p: Plan) -> Chain:
    """The plan's stage chain: its sources, device and starting weights, each step a Prefect task."""
    ck = p.checkpoint
    return Chain(
        p.spec,
        p.sources,
        p.device,
        encoding=ck["encoding"] if ck else None,
        schema=ck["schema"] if ck else None,
        weights=Weights.of(ck),
        run_stage=run_as_prefect_task,
    )


def _engine(run: Invocation) -> EngineBase:
    assert run.work is not None and run.work.chain.engine is not None  # after the timed body
    return run.work.chain.engine


def serve_backend(run: Invocation) -> float:
    """The serving backend (tasks/backends/setup.py), its set-up recorded on the run."""
    assert run.work is not None
    load = run.plan.checkpoint.get("load") if run.plan.checkpoint else None
    served = serving_backend(run.spec, run.work.chain, run.plan.backend, load, run.output.with_suffix(".ckpt"))
    if served.checkpoint is not None:
        run.ckpt_path = served.checkpoint
    if served.setup is not None and served.tags is not None:
        run.backend_setup, run.backend_tags = served.setup, served.tags
    return served.seconds


def collect(run: Invocation) -> dict[str, float]:
    """Step 3: engine and harness figures into the result (tasks/measure/collect.py),
    predictions committed, checkpoint saved; returns the metrics."""
    s, p, result = run.spec, run.plan, run.result
    assert run.work is not None and run.work.chain.engine is not None and run.region is not None
    work, chain = run.work, run.work.chain
    engine = chain.engine
    # per predict pass that ran; a request scenario's batches are per served request
    units = run.latency.served_requests if run.latency is not None else result.predict_passes
    cache_state = engine_figures(result, chain, engine, units)
    run.tracker.set_tags({"relflow.compiler_cache": cache_state})
    if chain.has_text:
        enc_s = sum(st["encode"].seconds for st in result.stages.values())
        result.extra[K.DATA_TEXT_CELLS] = float(work.text_cells_per_pass)
        result.extra[K.ENCODE_CELLS_PER_S] = work.text_cells / enc_s if enc_s > 0 else 0.0
    for phase in PHASES:
        run.backend_setup.graph_breaks_warmup[phase] = engine.graph_breaks_in_warmup(phase)
    result.extra.update(run.backend_setup.metrics())
    load = p.checkpoint.get("load") if p.checkpoint else None
    if load is not None:
        result.extra.update(load.metrics())
    if isinstance(engine, Engine):
        result.extra.update(fp8_metrics(engine.model))
    run.backend_tags = engine.backend_tags()  # after the passes: weights_native reads their fp8 fallbacks
    engine.close()
    engine.profiler.close()
    result.rows_written = run.writer.rows
    with named_write_errors(run.writer.path, "predictions", "run.output_dir"):
        result.output_bytes = run.writer.commit()
    result.output_path = str(run.output)
    result.stages["predict"]["write"].bytes = result.output_bytes * result.predict_passes
    run.memory.stop()
    result.host_peak_bytes = run.memory.host_peak_bytes
    result.host_peak_excluding_compiler_bytes = run.memory.host_peak_excluding_compiler_bytes
    result.device_peak_bytes = run.memory.device_peak_bytes
    if run.reference_quality is not None:
        result.extra.update(quality_delta(engine.quality.headline, result.quality, run.reference_quality))
    if run.latency is not None:
        result.extra.update(run.latency.metrics())
    if run.output_check is not None:
        result.extra.update(run.output_check.metrics())
    result.extra.update(
        {
            K.HARNESS_DATA_SECONDS: p.data_seconds,
            K.HARNESS_STARTUP_SECONDS: run.launch_seconds + run.mlflow_seconds,
            K.HARNESS_MLFLOW_STARTUP_SECONDS: run.mlflow_seconds,
            **run.buckets,  # harness.region_seconds and its buckets (tasks/scenarios/region.py)
            **run.gc_pauses,  # tasks/measure/gcpauses.py
            **run.region.metrics(),
        }
    )
    if s.run.mode == "train+predict":
        save_checkpoint(run, engine)
    facts = engine.facts()
    run.tracker.log_params(
        {
            "model.parameters": facts.parameters,
            "model.flops_per_root_row": facts.flops_per_root_row if facts.flops_per_root_row is not None else "none",
            "run.resolved_device": str(p.device),
        }
    )
    run.tracker.set_tags(facts.tags | ({"relflow.flops_note": facts.flops_note} if facts.flops_note else {}))
    result.extra.update(facts.metrics)
    result.extra.update(utilisation(s, p.device, engine, facts))
    # Everything the flow spent besides the five stages (checks, MLflow start, Prefect task
    # orchestration, meta inspection, checkpoint), up to here; final logging comes after.
    flow_seconds = wall_clock() - run.flow_start
    result.extra[K.HARNESS_FLOW_SECONDS] = flow_seconds
    result.extra[K.HARNESS_FLOW_OVERHEAD_SECONDS] = flow_seconds - result.timed_stage_seconds
    metrics = result.metrics()
    calls = sum(st.calls for stages in result.stages.values() for st in stages.values())
    # offline: the committed file is one row per root key in key order, the write floor's table
    predictions = run.output if s.run.scenario == "offline" else None
    metrics.update(run_floor_metrics(s, p.sources, p.device, metrics, calls, predictions))
    return metrics


def save_checkpoint(run: Invocation, engine: EngineBase) -> None:
    """The trained weights next to the predictions, as an MLflow artifact (and, for the
    reference model, an MLflow model with its input and output interface)."""
    s, p, chain = run.spec, run.plan, run.work.chain if run.work else None
    assert chain is not None
    if run.ckpt_path is None:  # else saved before serving (ONNX Runtime exports it)
        run.ckpt_path = run.output.with_suffix(".ckpt")
        engine.save_checkpoint(run.ckpt_path, s)
    run.tracker.log_artifact(run.ckpt_path, "checkpoint")
    if isinstance(engine, Engine):
        outputs = engine.needed_outputs(tuple(s.task.outputs))
        run.tracker.log_model(engine.model, model_interface(s, p.sources, engine.schema, engine.model.config, outputs))


def judge(run: Invocation, metrics: dict[str, float]) -> list[str]:
    """Step 4: the validity verdict (empty: VALID)."""
    reasons = verdict(run.spec, metrics, _engine(run).quality.headline)
    if run.latency is not None:
        reasons += latency_verdict(run.spec.run.scenario, run.spec.run.request, metrics)
        if run.latency.output_check is not None:
            reasons += run.latency.output_check.reasons()
    if not run.quality_meaningful and run.spec.task.min_quality is not None:
        reasons.append("task.min_quality set but weights are untrained (predict without run.checkpoint)")
    if run.quality_meaningful:  # a model no better than the majority class / the mean
        reasons += no_better_than_baseline(metrics)
    if run.output_check is not None:
        reasons += run.output_check.reasons()
    return reasons + utilisation_reasons(metrics) + drop_reasons(run.spec, metrics)


def log_run(run: Invocation, metrics: dict[str, float], reasons: list[str]) -> dict[str, Any]:
    """Step 5: metrics, system metrics, tags and artifacts to MLflow; the run FINISHED.
    Returns the flow's summary."""
    engine, tracker = _engine(run), run.tracker
    if run.latency is not None:  # sampled requests as MLflow traces, built from the record (not timed)
        req = run.spec.run.request
        metrics.update(log_request_traces(tracker, run.latency, req.trace_sample_rate, run.spec.run.seed))
    tracker.log_metrics(metrics)
    metrics.update(engine.flush_throughput(tracker))  # the callback logs its own estimate
    if run.latency is not None:  # the latency CDF: percentile 0..100 as the metric's steps
        tracker.log_metric_steps(K.LATENCY_CDF_MS, run.latency.cdf_ms())
    tracker.flush_system_metrics()
    tracker.set_tags(
        {
            "relflow.encoder_path": ",".join(sorted(engine.paths_seen)),
            **(run.backend_tags or engine.backend_tags()),
            "relflow.graph_break_reasons": json.dumps(graph_break_reasons()),
            "relflow.quality_meaningful": str(run.quality_meaningful).lower(),
            "relflow.output_path": str(run.output),
            "relflow.validity": "INVALID" if reasons else "VALID",
            "relflow.invalid_reasons": "; ".join(reasons),
        }
    )
    floor_doubts = untrusted(metrics)
    if floor_doubts:  # the fractions stand on a floor that is not one; the run's own figures stay right
        tracker.set_tags({UNTRUSTED_TAG: "; ".join(floor_doubts)})
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
    try:
        run.memory.start()  # inside: a sampler that cannot start must not leave the run RUNNING
        timed_body(run)
        metrics = collect(run)
        summary = log_run(run, metrics, judge(run, metrics))
    except BaseException as err:
        try:
            run.memory.stop()
            if run.work is not None and run.work.chain.engine is not None:
                run.work.chain.engine.close()
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


def _log_profile(tracker: Tracker, engine: EngineBase) -> dict[str, list[dict[str, Any]]]:
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
    prof.cleanup()
    return {phase: rows[:10] for phase, rows in prof.top_ops.items()}


def _sample_csv(path: Path, rows: int = 100) -> str:
    """First rows of the predictions as CSV (nested values shown as text)."""
    table = pq.ParquetFile(path).read_row_group(0).slice(0, rows)
    return pd.DataFrame(
        {name: [str(v) for v in col.to_pylist()] for name, col in zip(table.column_names, table.columns, strict=True)}
    ).to_csv(index=False)
