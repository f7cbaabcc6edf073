"""The ``benchmark`` flow: one spec, five timed stages, one MLflow run.

    retrieve -> preprocess -> tensorize -> compute -> write

This file is the order of work and nothing else. The flow reads as its steps:

    plan (tasks/run/checks/plan.py) -> start_run -> timed_body (tasks/run/scenarios/region.py)
        -> collect (tasks/run/record/assemble.py) -> floor fractions (flows/floors.py)
        -> judge (tasks/run/record/judge.py) -> log_run (tasks/run/record/run_log.py)

Each step gets the ``Invocation`` (tasks/run/scenarios/invocation.py: the run's identity, plan
and shared handles) and returns what it measured: the timed body a ``Timed``, collect the
record (``RunResult``), which judge and log read. The work
itself is not here: the plan's stage chain (tasks/run/chain.py) owns the order of steps,
the workload (tasks/run/scenarios/workload.py) its chunks, training epochs and calibration fit,
and the scenarios (tasks/run/scenarios: offline passes, single_stream, server) the predict phase.
The flow hands the chain a runner that makes each step a Prefect task (``NO_CACHE``: hashing
tables costs seconds), timed inside the task with the shared clock, never with Prefect's
records, and counts those calls (the orchestration floor's). Training epochs and predict
passes are separate phases (``e2e.train.*``, ``e2e.predict.*``), never summed.

Every check that can fail on user input runs before the MLflow run starts. After that, any
error ends the run FAILED (KILLED for interrupts) and removes the partial prediction file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from flows.artifacts import publish_run_artifact
from flows.floors import run_floor_metrics
from tasks.libraries import library_packages, library_tags
from tasks.measure import keys as K
from tasks.measure.clock import Clock, unix_time, wall_clock
from tasks.measure.environment import fingerprint, host_load_per_core
from tasks.measure.host_env import CpuTicks, steal_fraction
from tasks.measure.hostload import OtherCpu, other_cpu_fraction_before
from tasks.measure.memory import PeakMemory
from tasks.measure.records import Region
from tasks.measure.stats import CI_METHOD
from tasks.run.backend_setup import Served, serving_backend
from tasks.run.chain import Chain, Weights
from tasks.run.checks.plan import Plan, plan
from tasks.run.distributed import launch as distributed
from tasks.run.record import relbench_scores
from tasks.run.record.assemble import collect
from tasks.run.record.judge import judge
from tasks.run.record.run_log import log_run
from tasks.run.reference_pass import reference_quality
from tasks.run.scenarios.invocation import Invocation, Timed, predict_threads
from tasks.run.scenarios.latency import LatencyRecord
from tasks.run.scenarios.offline import OfflineRun
from tasks.run.scenarios.outputs import OutputCheck, ServedOutputs, check_offline_outputs, check_outputs
from tasks.run.scenarios.region import RegionSteps, run_region
from tasks.run.scenarios.runner import run_requests
from tasks.run.scenarios.workload import Workload
from tasks.runtime import interrupts, progress
from tasks.runtime.hostlock import host_lock, lock_path
from tasks.runtime.threads import apply_threads
from tasks.sources.databases import close_all as close_databases
from tasks.sources.relbench import folder_of
from tasks.spec import Spec, parse_spec
from tasks.stages.write import PredictionWriter
from tasks.tracking.datasets import describe_sources
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
# calibrate, write): the chain (tasks/run/chain.py) decides the order, Prefect records it.
_STAGE_TASKS = {
    name: task(name=name, **STAGE_TASK)(_run_step)
    for name in ("retrieve", "preprocess", "encode", "tensorize", "compute", "calibrate", "write")
}


def run_as_prefect_task(stage: str, step: Callable[[], _T], clock: Clock) -> tuple[_T, float]:
    """The chain's ``StageRunner`` in the flow: each step a Prefect task, timed inside it."""
    out, seconds = _STAGE_TASKS[stage](quote(step), quote(clock))
    return cast(_T, out), seconds


@dataclass
class PrefectCalls:
    """The timed body's Prefect task calls (the orchestration floor's), counted as they are made."""

    n: int = 0


@task(name="requests", **STAGE_TASK)
def requests_task(work: Workload, writer: PredictionWriter) -> LatencyRecord:
    """single_stream / server: timed requests (tasks/run/scenarios)."""
    return run_requests(work, writer)


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
        **fingerprint(p.device, library_packages()),  # every registered library's versions
        **library_tags(p.library),  # the model under test (asked once, by the plan) and its version
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
        memory=PeakMemory(p.device),
        flow_start=flow_start,
        launch_seconds=flow_start - launched_at if launched_at else 0.0,
        mlflow_seconds=mlflow_seconds,
    )


def timed_body(run: Invocation) -> Timed:
    """Step 2: under the host lock, the timed region: list keys, train epochs, predict passes;
    then, still under the lock and untimed, the output checks and the reference quality.

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
        calls = PrefectCalls()
        run.work = work = Workload(chain_for(run, calls))

        def requests() -> LatencyRecord:
            progress.emit("phase", name=f"{s.run.scenario} requests")
            calls.n += 1  # one task for every request (each runs its steps directly)
            return requests_task(work, run.writer)

        steps = RegionSteps(
            train=lambda: (
                distributed.train(work, run.plan.spec_dir, run.run_id, s.name, run.tracker.uri)
                if s.run.distributed
                else work.train()
            ),
            distributed=s.run.distributed is not None,
            serving_backend=lambda: serve_backend(run),  # outside every stage (not in e2e); its set-up returned
            requests=requests if s.run.scenario != "offline" else None,  # single_stream / server
            writer=run.writer,  # offline: predict passes (tasks/run/scenarios/offline.py)
        )
        ran = run_region(work, steps, train=s.run.mode == "train+predict", repeats=s.run.repeats)
        region_end_unix = unix_time()
        other_during = other.stop()
        stolen = steal_fraction(ticks_start, CpuTicks.now())
        run.tracker.stop_system_metrics()
        offline = ran.scenario if isinstance(ran.scenario, OfflineRun) else None
        latency = ran.scenario if isinstance(ran.scenario, LatencyRecord) else None
        # still under the host lock, untimed: the output checks, the reference quality
        output_check = untimed_checks(run, work, latency, offline.served_outputs if offline is not None else None)
        quality = reference_quality_after(run, work, latency)
    host = Region(waited, region_start_unix, region_end_unix, load_start, other_before, other_during, stolen)
    return Timed(ran, host, calls.n, output_check, quality)


def untimed_checks(
    run: Invocation, work: Workload, latency: LatencyRecord | None, served: ServedOutputs | None
) -> OutputCheck | None:
    """After the region, outside every timing: the output checks. A request run's goes into its
    record; ``served``, the last offline pass's rows (run.check_outputs), gives the returned one."""
    s = run.spec
    if latency is not None and latency.served_outputs is not None:
        progress.emit("phase", name="output check (not timed)")
        latency.output_check = check_outputs(work.chain, latency.served_outputs, s.run)
        latency.served_outputs = None  # the served tensors are no longer needed
    if served is None:
        return None
    progress.emit("phase", name="output check vs a plain pass (not timed)")
    check = check_offline_outputs(work.chain, served)
    served.release()  # the served tensors are no longer needed (the OfflineRun still holds the record)
    return check


def reference_quality_after(run: Invocation, work: Workload, latency: LatencyRecord | None) -> dict[str, float] | None:
    """After the region, untimed: quality of the reference checkpoint over the same rows."""
    if run.plan.reference is None:
        return None
    progress.emit("phase", name="reference quality (not timed)")
    return reference_quality(
        run.spec,
        run.plan.reference,
        len(work.chunks),
        work.prepare_untimed,
        run.plan.device,
        # a request scenario: the rows its requests scored, repeats and the cold one included
        latency.scored_keys if latency is not None else None,
        work.chain.prepare_untimed,
    )


def chain_for(run: Invocation, calls: PrefectCalls) -> Chain:
    """The plan's stage chain: its sources, device and starting weights, each step a Prefect
    task (counted in ``calls``: the orchestration floor's)."""
    p, ck = run.plan, run.plan.checkpoint

    def run_stage(stage: str, step: Callable[[], _T], clock: Clock) -> tuple[_T, float]:
        calls.n += 1
        return run_as_prefect_task(stage, step, clock)

    return Chain(
        p.spec,
        p.sources,
        p.device,
        weights=Weights.of(ck),
        run_stage=run_stage,
        library=p.library,
    )


def serve_backend(run: Invocation) -> Served:
    """The serving backend (tasks/run/backend_setup.py): its set-up, and the checkpoint it saved."""
    assert run.work is not None
    load = run.plan.checkpoint.load if run.plan.checkpoint else None
    return serving_backend(run.spec, run.work.chain, run.plan.backend, load, run.output.with_suffix(".ckpt"))


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
    try:
        run.memory.start()  # inside: a sampler that cannot start must not leave the run RUNNING
        timed = timed_body(run)
        record = collect(run, timed)  # tasks/run/record/assemble.py
        metrics = record.metrics()
        # offline: the committed file is one row per root key in key order, the write floor's table
        predictions = run.output if s.run.scenario == "offline" else None
        # at the threads the predict compute ran at: an ONNX Runtime session's own, or the requests'
        threads = predict_threads(run.engine, timed.latency)
        floors = run_floor_metrics(
            s, p.sources, p.device, metrics, timed.prefect_calls, predictions, threads, p.library
        )
        metrics.update(floors)
        metrics.update(relbench_figures(run, p, predictions))
        # tasks/run/record/judge.py, tasks/run/record/run_log.py
        summary = log_run(run, timed, record, metrics, judge(run, timed, metrics))
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


def relbench_figures(run: Invocation, p: Plan, predictions: Path | None) -> dict[str, float]:
    """A RelBench task's own figures and baselines (tasks/run/record/relbench_scores.py), after the
    region: the prediction table beside the predictions, tagged ``relflow.relbench_predictions``.
    Only an offline run predicts every test row; a request run's file holds the rows it served."""
    s = run.spec
    if s.source.relbench is None:
        return {}
    out = {K.RELBENCH_TASK_ROWS_SECONDS: p.task_rows_seconds}
    if predictions is None or not predictions.is_file():
        return out
    progress.emit("phase", name="RelBench scores (not timed)")
    scores = relbench_scores.score(folder_of(s, p.spec_dir), predictions, predictions.with_suffix(".relbench.csv"))
    if scores is None:
        return out
    if scores.csv is not None:
        run.tracker.set_tags({"relflow.relbench_predictions": str(scores.csv)})
    return out | scores.figures()


def _remove_outputs(output: Path) -> None:
    """A run that did not finish leaves none of its files: predictions, checkpoint, temps."""
    for path in (output, output.with_suffix(".ckpt"), output.with_suffix(".relbench.csv")):
        path.unlink(missing_ok=True)
    if output.parent.is_dir():
        for tmp in output.parent.glob(f".{output.stem}*.tmp-*"):
            tmp.unlink(missing_ok=True)
