"""The ``peak-qps`` chart: each probe's early-stopping p99 against its target rate, the
bound as a line and the bracket shaded (a pure function of the search's result)."""

from __future__ import annotations

import plotly.graph_objects as go

from tasks.scenarios.peak import PeakResult

LAYOUT = dict(template="plotly_white", height=460, margin=dict(l=70, r=30, t=70, b=70))


def peak_figure(res: PeakResult) -> go.Figure:
    fig = go.Figure()
    title = "Early-stopping p99 against Poisson rate"
    if res.low is not None:
        title += f": peak {res.low:.3g} QPS" + (f" (bracket {res.low:.3g}..{res.high:.3g})" if res.high else "")
    fig.update_layout(title=title, xaxis_title="target rate (QPS)", yaxis_title="p99, early stopping (ms)", **LAYOUT)
    probes = sorted(res.probes, key=lambda p: p.rate)
    for passed, name, colour in ((True, "within the bound", "#2a7"), (False, "over the bound / no estimate", "#c33")):
        pts = [p for p in probes if p.passed == passed]
        fig.add_scatter(
            x=[p.rate for p in pts],
            # a probe without an estimate (too few requests, failed) is drawn at the bound
            y=[p.p99_ms if p.p99_ms is not None else res.bound_ms for p in pts],
            mode="markers",
            name=name,
            marker=dict(color=colour, size=9),
            text=[f"run {p.run_id or '-'}; {p.validity or '-'}" for p in pts],
        )
    drawn = [p for p in probes if p.p99_ms is not None]
    fig.add_scatter(
        x=[p.rate for p in drawn], y=[p.p99_ms for p in drawn], mode="lines", line=dict(color="#999"), showlegend=False
    )
    fig.add_hline(y=res.bound_ms, line_dash="dot", line_color="#555", annotation_text=f"bound {res.bound_ms:g} ms")
    if res.low is not None and res.high is not None:
        fig.add_vrect(x0=res.low, x1=res.high, fillcolor="#2a7", opacity=0.15, line_width=0)
    return fig
