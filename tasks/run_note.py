"""The run's description (markdown): what a reader of the run page needs at a glance.

Shown by the MLflow UI on the run page (``Tracker.set_description``): the verdict with its
reasons, the five-stage table (seconds, root rows, rows/s, share of end to end) and the
headline figures. Built from the same stage table and metrics the run logs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def run_description(name: str, stage_table: Sequence[Mapping[str, Any]], metrics: Mapping[str, float],
                    reasons: Sequence[str], quality_metric: str | None, quality_meaningful: bool) -> str:
    verdict = "**VALID**" if not reasons else "**INVALID**: " + "; ".join(reasons)
    lines = [f"### {name}: {verdict}", "",
             "| stage | seconds | root rows | rows/s | share of e2e |",
             "|---|---:|---:|---:|---:|"]
    for row in stage_table:
        lines.append(f"| {row['stage']} | {row['seconds']:.3f} | {int(row['rows']):,} | "
                     f"{row['rows_per_s']:,.0f} | {row['share']:.1%} |")
    lines.append(f"| **end-to-end** | **{metrics['e2e.seconds']:.3f}** | {int(metrics['data.rows_predicted']):,} "
                 f"| **{metrics['e2e.rows_per_s']:,.0f}** | 100% |")
    lines += ["", f"- compute steady state: {metrics['compute.steady_rows_per_s']:,.0f} rows/s (predict); "
              f"first call {metrics['compute.first_call_seconds']:.3f} s"]
    key = f"quality.{quality_metric}"
    if quality_metric and key in metrics:
        note = "" if quality_meaningful else " (untrained weights: not meaningful)"
        lines.append(f"- quality: {quality_metric} {metrics[key]:.4f}{note}")
    lines.append(f"- host peak memory: {metrics['memory.host_peak_bytes'] / 2**20:,.0f} MiB")
    return "\n".join(lines)
