"""The run's description (markdown): what a reader of the run page needs at a glance.

Shown by the MLflow UI on the run page (``Tracker.set_description``): the verdict with its
reasons, the stage table per phase (seconds, root rows, rows/s, share of that phase's end to
end, one end-to-end row per phase) and the headline figures. Built from the same stage table
and metrics the run logs; metric names come from ``tasks/measure/keys.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tasks.measure import keys as K

_E2E_LABEL = {"predict": "end-to-end predict (headline)", "train": "end-to-end train (trained rows)"}
# A request scenario's stage table sums its served calls' steps: service time, not a headline.
_REQUEST_E2E_LABEL = "served requests (service time, no queueing or idle)"


def run_description(
    name: str,
    stage_table: Sequence[Mapping[str, Any]],
    metrics: Mapping[str, float],
    reasons: Sequence[str],
    quality_metric: str | None,
    quality_meaningful: bool,
) -> str:
    verdict = "**VALID**" if not reasons else "**INVALID**: " + "; ".join(reasons)
    lines = [
        f"### {name}: {verdict}",
        "",
        "| phase | stage | seconds | root rows | rows/s | share of phase |",
        "|---|---|---:|---:|---:|---:|",
    ]
    requests = K.LATENCY_ROWS_PER_WALL_S in metrics
    for phase in K.PHASES:
        rows = [r for r in stage_table if r.get("phase", "predict") == phase]
        if not rows:
            continue
        for row in rows:
            lines.append(
                f"| {phase} | {row['stage']} | {row['seconds']:.3f} | {int(row['rows']):,} | "
                f"{row['rows_per_s']:,.0f} | {row['share']:.1%} |"
            )
        seconds, count, rate = (K.e2e(phase, w) for w in ("seconds", "rows", "rows_per_s"))
        if seconds in metrics:
            label = _REQUEST_E2E_LABEL if phase == "predict" and requests else _E2E_LABEL[phase]
            lines.append(
                f"| **{phase}** | **{label}** | **{metrics[seconds]:.3f}** | "
                f"{int(metrics.get(count, 0)):,} | **{metrics.get(rate, 0.0):,.0f}** | 100% |"
            )
    lines.append("")
    if requests:
        lines.append(
            f"- requests: {metrics[K.LATENCY_ROWS_PER_WALL_S]:,.1f} rows per wall second of the scenario, "
            f"{metrics.get(K.LATENCY_ROWS_PER_SERVICE_S, 0.0):,.1f} rows per second of service time"
        )
    if K.STEADY_ROWS_PER_S in metrics:  # request scenarios report latency instead
        steady = f"- compute steady state: {metrics[K.STEADY_ROWS_PER_S]:,.0f} rows/s (predict)"
        if K.TRAIN_STEADY_ROWS_PER_S in metrics:
            steady += f", {metrics[K.TRAIN_STEADY_ROWS_PER_S]:,.0f} rows/s (train)"
        lines.append(steady + f"; first call {metrics.get(K.FIRST_CALL_SECONDS, 0.0):.3f} s")
    if K.compute("predict", K.MFU) in metrics:
        lines.append(f"- MFU: {metrics[K.compute('predict', K.MFU)]:.2%} (predict)")
    key = K.quality(quality_metric) if quality_metric else ""
    if quality_metric and key in metrics:
        note = "" if quality_meaningful else " (untrained weights: not meaningful)"
        lines.append(f"- quality: {quality_metric} {metrics[key]:.4f}{note}")
    if K.HOST_PEAK_BYTES in metrics:
        lines.append(f"- host peak memory: {metrics[K.HOST_PEAK_BYTES] / 2**20:,.0f} MiB")
    return "\n".join(lines)
