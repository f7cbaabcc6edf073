"""The flow's ``collect`` step: the timed body's reports assembled into the run's record.

After the region (flows/benchmark.py orders the steps), in this order:

1. the engine's figures and the serving backend's set-up (``engine_figures``, collect.py);
2. the engine closed, the prediction file committed, the memory sampler stopped;
3. what the harness measured around the work: quality against the reference, start-up, the
   region's buckets and the host;
4. the checkpoint saved (train+predict; tasks/run/record/run_log.py);
5. the model's facts and MFU (at the thread count each phase ran at);
6. ``harness.flow_seconds`` up to here; the ``RunResult``, whose ``metrics()`` the flow logs.

The floor ledger's fractions need a Prefect call of their own (flows/floors.py), so the flow
adds them after this.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from tasks.measure import keys as K
from tasks.measure.clock import wall_clock
from tasks.measure.memory import MemoryPeaks
from tasks.measure.records import (
    BackendSetup,
    EngineReport,
    FlowSeconds,
    HarnessFigures,
    ModelReport,
    OutputReport,
    RunResult,
)
from tasks.run.record.collect import engine_figures, utilisation
from tasks.run.record.run_log import save_checkpoint
from tasks.run.reference_pass import quality_delta
from tasks.run.scenarios.invocation import Invocation, Timed, predict_threads
from tasks.runtime.writes import named_write_errors


def collect(run: Invocation, timed: Timed) -> RunResult:
    """The record: the region's reports with what is read after it (the engine's figures, the
    backend's set-up, the committed files, memory peaks, the harness's figures, the model's);
    its ``metrics()`` are the run's without ``floor.*``."""
    ran = timed.ran
    passes = timed.offline.report.passes if timed.offline is not None else 0
    engine = _engine_part(run, timed, passes)
    backend = _backend_setup(run, ran.backend.setup)
    checkpoint_load = run.plan.checkpoint.load if run.plan.checkpoint else None
    rows, nbytes, memory = _commit_outputs(run)
    reference = {}
    if timed.reference_quality is not None:
        reference = quality_delta(run.engine.quality.headline, engine.quality, timed.reference_quality)
    harness = HarnessFigures(
        run.plan.data_seconds,
        run.launch_seconds + run.mlflow_seconds,
        run.mlflow_seconds,
        ran.timed,  # harness.region_seconds, its buckets and collector pauses (tasks/run/scenarios/region.py)
        timed.host,
    )
    checkpoint = ran.backend.checkpoint  # saved before serving (ONNX Runtime exports it)
    if run.spec.run.mode == "train+predict":
        checkpoint = save_checkpoint(run, checkpoint)
    model = _model_part(run, timed)
    # Everything the flow spent besides the five stages (checks, MLflow start, Prefect task
    # orchestration, meta inspection, checkpoint), up to here; final logging comes after.
    flow_seconds = wall_clock() - run.flow_start
    return RunResult(
        stages=ran.stages.with_bytes("predict", "write", nbytes * passes),
        data=ran.data,
        training=ran.training,
        engine=engine,
        memory=memory,
        output=OutputReport(rows, nbytes, str(run.output), str(checkpoint) if checkpoint else None),
        data_checks=dict(run.plan.data_metrics),
        calibration=ran.calibration,
        backend_setup=backend,
        checkpoint_load=checkpoint_load,
        reference_quality=reference,
        offline=timed.offline.report if timed.offline is not None else None,
        latency=timed.latency,
        projection=ran.projections,
        output_check=timed.output_check,
        harness=harness,
        model=model,
        flow_seconds=FlowSeconds(flow_seconds, flow_seconds - ran.stages.timed_seconds),
    )


def _engine_part(run: Invocation, timed: Timed, passes: int) -> EngineReport:
    """The engine's figures (the compiler-cache state tagged)."""
    assert run.work is not None
    # per predict pass that ran; a request scenario's batches are per served request
    units = timed.latency.served_requests if timed.latency is not None else passes
    report = engine_figures(run.work.chain, run.engine, units)
    run.tracker.set_tags({"relflow.compiler_cache": report.compiler_cache})
    return report


def _backend_setup(run: Invocation, setup: BackendSetup | None) -> BackendSetup:
    """The serving backend's set-up (none: a library's own engine) with each phase's graph
    breaks in its warm-up."""
    breaks = {phase: run.engine.graph_breaks_in_warmup(phase) for phase in K.PHASES}
    return replace(setup if setup is not None else BackendSetup(), graph_breaks_warmup=breaks)


def _commit_outputs(run: Invocation) -> tuple[int, int, MemoryPeaks]:
    """The engine closed, the kept prediction file committed (its rows and bytes), the memory
    sampler stopped (its peaks)."""
    engine = run.engine
    engine.close()
    engine.profiler.close()
    rows = run.writer.rows
    with named_write_errors(run.writer.path, "predictions", "run.output_dir"):
        nbytes = run.writer.commit()
    return rows, nbytes, run.memory.stop()


def _model_part(run: Invocation, timed: Timed) -> ModelReport:
    """The model's facts (params and tags) and its utilisation."""
    s, p, engine = run.spec, run.plan, run.engine
    facts = engine.facts()
    run.tracker.log_params(
        {
            "model.parameters": facts.parameters,
            "model.flops_per_root_row": facts.flops_per_root_row if facts.flops_per_root_row is not None else "none",
            "run.resolved_device": str(p.device),
        }
    )
    run.tracker.set_tags(facts.tags | ({"relflow.flops_note": facts.flops_note} if facts.flops_note else {}))
    # a session's own count, or a request run's (None: the process's)
    threads = predict_threads(engine, timed.latency)
    return ModelReport(
        figures=facts.metrics,
        utilisation={
            **utilisation(s, p.device, engine, facts, threads),
            K.PREDICT_INTRA_OP_THREADS: float(threads if threads is not None else torch.get_num_threads()),
        },
    )
