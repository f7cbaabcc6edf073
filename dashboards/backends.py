"""The backends report as a chart: pure functions from report rows or child runs to Plotly.

Left: steady rows/s per variant with its 95% CI and end-to-end predict rows/s beside it;
right: the headline quality's delta against the fp16 reference. Variants are the children
of a ``relflow-bench backends-report`` parent (tag ``relflow.variant``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tasks.measure import keys as K
from tasks.tracking.store import RunRecord

LAYOUT = dict(template="plotly_white", height=460, margin=dict(l=70, r=30, t=70, b=130))


def rows_from_runs(runs: Sequence[RunRecord]) -> list[dict[str, Any]]:
    """Report rows from FINISHED predict-mode children tagged ``relflow.variant`` (medians)."""
    from flows.sweeps.backends_report import HEADLINE, Sample, summarize

    kids = [
        r
        for r in runs
        if r.status == "FINISHED"
        and r.tags.get("relflow.variant", "train") != "train"
        and r.tags.get("mlflow.parentRunId")
        and K.STEADY_ROWS_PER_S in r.metrics
        and ("run.backend" in r.params)
    ]
    if not kids:
        return []
    kind = kids[-1].params.get("task.kind", "category")
    samples = [
        Sample(r.tags["relflow.variant"], 0, r.metrics, r.tags, r.run_id, r.tags.get("relflow.validity", ""))
        for r in kids
    ]
    return summarize(samples, HEADLINE.get(kind, "accuracy"))


def backends_figure(rows: Sequence[dict[str, Any]], headline: str = "accuracy") -> go.Figure:
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.65, 0.35],
        subplot_titles=("throughput (rows/s)", f"{headline} delta vs fp16 reference"),
    )
    fig.update_layout(title="Backends and weight formats, side by side", barmode="group", **LAYOUT)
    if not rows:
        fig.add_annotation(text="no backends-report runs", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
        return fig
    names = [r["variant"] for r in rows]
    # Error bars only where the rounds support a 95% interval (6 or more); none otherwise.
    fig.add_trace(
        go.Bar(
            name="steady compute",
            x=names,
            y=[r["steady_rows_per_s"] for r in rows],
            error_y=dict(
                type="data",
                symmetric=False,
                array=[_gap(r["steady_ci_high"], r["steady_rows_per_s"]) for r in rows],
                arrayminus=[_gap(r["steady_rows_per_s"], r["steady_ci_low"]) for r in rows],
            ),
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Bar(name="end-to-end predict", x=names, y=[r["e2e_predict_rows_per_s"] for r in rows]), row=1, col=1
    )
    fig.add_trace(
        go.Bar(name=f"{headline} delta", x=names, y=[r["delta_vs_reference"] for r in rows], showlegend=False),
        row=1,
        col=2,
    )
    return fig


def _gap(a: float | None, b: float | None) -> float:
    return 0.0 if a is None or b is None else a - b
