"""The flow's ``log`` step and the trained checkpoint: what a finished run leaves in MLflow.

``log_run`` writes the metrics (and the request traces and latency CDF of a request run), the
sampled system metrics, the tags (validity, encoder path, backend), the profiler's tables, the
stage table and a sample of the predictions, ends the run FINISHED and returns the flow's
summary. ``save_checkpoint`` writes the trained weights next to the predictions and logs them
(collect calls it: its seconds are the flow's, before ``harness.flow_seconds`` is read).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from tasks.measure import keys as K
from tasks.measure.floor_trust import UNTRUSTED_TAG, untrusted
from tasks.measure.profiling import to_markdown as profile_markdown
from tasks.measure.records import RunResult
from tasks.run.scenarios.invocation import Invocation, Timed
from tasks.runtime.masking import mask_uri
from tasks.stages.engine import EngineBase, graph_break_reasons
from tasks.tracking.datasets import model_interface
from tasks.tracking.run_note import run_description
from tasks.tracking.traces import log_request_traces
from tasks.tracking.writer import Tracker


def save_checkpoint(run: Invocation, saved: Path | None) -> Path:
    """The trained weights next to the predictions (unless ``saved`` before serving: ONNX
    Runtime exports them), as an MLflow artifact (and, for the reference model, an MLflow
    model with its input and output interface); returns the checkpoint's path."""
    s, p, engine = run.spec, run.plan, run.engine
    path = saved
    if path is None:
        path = run.output.with_suffix(".ckpt")
        engine.save_checkpoint(path, s)
    run.tracker.log_artifact(path, "checkpoint")
    assert run.work is not None  # after the timed region
    reference = run.work.chain.side.reference_engine()
    if reference is not None:  # model/'s engine: its interface is the harness's
        outputs = reference.needed_outputs(tuple(s.task.outputs))
        model, config = reference.model, reference.model.config
        run.tracker.log_model(model, model_interface(s, p.sources, reference.schema, config, outputs))
    return path


def log_run(
    run: Invocation, timed: Timed, record: RunResult, metrics: dict[str, float], reasons: list[str]
) -> dict[str, Any]:
    """Metrics, system metrics, tags and artifacts to MLflow; the run FINISHED. Returns the
    flow's summary."""
    engine, tracker, latency = run.engine, run.tracker, timed.latency
    if latency is not None:  # sampled requests as MLflow traces, built from the record (not timed)
        req = run.spec.run.request
        metrics.update(log_request_traces(tracker, latency, req.trace_sample_rate, run.spec.run.seed))
    tracker.log_metrics(metrics)
    metrics.update(engine.flush_throughput(tracker))  # the callback logs its own estimate
    if latency is not None:  # the latency CDF: percentile 0..100 as the metric's steps
        tracker.log_metric_steps(K.LATENCY_CDF_MS, latency.cdf_ms())
    tracker.flush_system_metrics()
    tracker.set_tags(_tags(run, record, reasons))
    floor_doubts = untrusted(metrics)
    if floor_doubts:  # the fractions stand on a floor that is not one; the run's own figures stay right
        tracker.set_tags({UNTRUSTED_TAG: "; ".join(floor_doubts)})
    profile = _log_profile(tracker, engine)
    stage_table = record.stages.table()
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
        "checkpoint_path": record.output.checkpoint,
        "quality_meaningful": run.quality_meaningful,
        "quality_metric": engine.quality.headline,
        "generated_data": run.plan.generated,
        "encoder_path": ",".join(sorted(engine.paths_seen)),
        "validity": "INVALID" if reasons else "VALID",
        "invalid_reasons": reasons,
        "profile": profile,
    }


def _tags(run: Invocation, record: RunResult, reasons: list[str]) -> dict[str, str]:
    engine = run.engine
    served = record.engine.backend_tags if record.engine is not None else {}  # read before the engine closed
    return {
        "relflow.encoder_path": ",".join(sorted(engine.paths_seen)),
        **(served or engine.backend_tags()),
        "relflow.graph_break_reasons": json.dumps(graph_break_reasons()),
        "relflow.quality_meaningful": str(run.quality_meaningful).lower(),
        "relflow.output_path": str(run.output),
        "relflow.validity": "INVALID" if reasons else "VALID",
        "relflow.invalid_reasons": "; ".join(reasons),
    }


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
    csv: str = pd.DataFrame(
        {name: [str(v) for v in col.to_pylist()] for name, col in zip(table.column_names, table.columns, strict=True)}
    ).to_csv(index=False)
    return csv
