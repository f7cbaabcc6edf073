"""The flow's ``collect`` step: a finished timed region turned into the run's metrics.

After the region (flows/benchmark.py orders the steps), in this order:

1. the engine's figures and the serving backend's set-up (``engine_figures``, collect.py);
2. the engine closed, the prediction file committed, the memory sampler stopped;
3. what the harness measured around the work: quality against the reference, the request
   record, the output check, start-up, the region's buckets and the host;
4. the checkpoint saved (train+predict; tasks/run/record/run_log.py);
5. the model's facts and MFU (at the thread count each phase ran at);
6. ``harness.flow_seconds`` up to here, and ``RunResult.metrics()``.

The floor ledger's fractions need a Prefect call of their own (flows/floors.py), so the flow
adds them after this.
"""

from __future__ import annotations

import torch

from tasks.measure import keys as K
from tasks.measure.clock import wall_clock
from tasks.measure.records import FlowSeconds, HarnessFigures, ModelReport, OutputReport, RunResult
from tasks.run.record.collect import engine_figures, utilisation
from tasks.run.record.run_log import save_checkpoint
from tasks.run.reference_pass import quality_delta
from tasks.run.scenarios.invocation import Invocation
from tasks.runtime.writes import named_write_errors


def collect(run: Invocation) -> dict[str, float]:
    """Engine and harness figures into the result, predictions committed, checkpoint saved;
    returns the metrics (without ``floor.*``)."""
    _engine_part(run)
    _commit_outputs(run)
    _harness_part(run)
    if run.spec.run.mode == "train+predict":
        save_checkpoint(run)
    _model_part(run)
    # Everything the flow spent besides the five stages (checks, MLflow start, Prefect task
    # orchestration, meta inspection, checkpoint), up to here; final logging comes after.
    flow_seconds = wall_clock() - run.flow_start
    run.result.flow_seconds = FlowSeconds(flow_seconds, flow_seconds - run.result.stages.timed_seconds)
    return run.result.metrics()


def _engine_part(run: Invocation) -> None:
    """The engine's figures, the serving backend's and the loaded checkpoint's."""
    result, engine = run.result, run.engine
    assert run.work is not None
    # per predict pass that ran; a request scenario's batches are per served request
    units = run.latency.served_requests if run.latency is not None else _passes(result)
    result.engine = engine_figures(run.work.chain, engine, units)
    run.tracker.set_tags({"relflow.compiler_cache": result.engine.compiler_cache})
    for phase in K.PHASES:
        run.backend_setup.graph_breaks_warmup[phase] = engine.graph_breaks_in_warmup(phase)
    result.backend_setup = run.backend_setup
    result.checkpoint_load = run.plan.checkpoint.load if run.plan.checkpoint else None
    run.backend_tags = engine.backend_tags()  # after the passes: weights_native reads their fp8 fallbacks


def _passes(result: RunResult) -> int:
    """The offline predict passes (0: a request scenario's run)."""
    return result.offline.passes if result.offline is not None else 0


def _commit_outputs(run: Invocation) -> None:
    """The engine closed, the kept prediction file committed, the memory peaks read."""
    result, engine = run.result, run.engine
    engine.close()
    engine.profiler.close()
    rows = run.writer.rows
    with named_write_errors(run.writer.path, "predictions", "run.output_dir"):
        result.output = OutputReport(rows, run.writer.commit(), str(run.output))
    result.stages = result.stages.with_bytes("predict", "write", result.output.bytes * _passes(result))
    result.memory = run.memory.stop()


def _harness_part(run: Invocation) -> None:
    """What the harness measured around the work."""
    result = run.result
    assert run.region is not None and run.timed is not None and result.engine is not None  # after the engine part
    if run.reference_quality is not None:
        quality = result.engine.quality
        result.reference_quality = quality_delta(run.engine.quality.headline, quality, run.reference_quality)
    result.latency, result.output_check = run.latency, run.output_check
    result.harness = HarnessFigures(
        run.plan.data_seconds,
        run.launch_seconds + run.mlflow_seconds,
        run.mlflow_seconds,
        run.timed,  # harness.region_seconds, its buckets and collector pauses (tasks/run/scenarios/region.py)
        run.region,
    )


def _model_part(run: Invocation) -> None:
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
    threads = run.predict_threads  # a session's own count, or a request run's (None: the process's)
    run.result.model = ModelReport(
        figures=facts.metrics,
        utilisation={
            **utilisation(s, p.device, engine, facts, threads),
            K.PREDICT_INTRA_OP_THREADS: float(threads if threads is not None else torch.get_num_threads()),
        },
    )
