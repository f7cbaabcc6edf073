"""The ``peak-qps`` chart (``peak_qps.html``): the search for the peak rate, probe by probe.

Each probe's ``latency.request_ms.p99_server_rule`` (the p99 LoadGen's server rule judges, not
the early-stopping estimate) against its target Poisson rate, passed and failed probes apart,
the bound as a line and the bracket shaded. The title claims a peak only when the search
bracketed one, as ``server.peak_qps`` does; otherwise it names the bound the search found. A
pure function of the search's result."""

from __future__ import annotations

import plotly.graph_objects as go

from tasks.run.scenarios.peak import PeakResult

LAYOUT = dict(template="plotly_white", height=460, margin=dict(l=70, r=30, t=70, b=70))
TITLE = "Peak-QPS search: p99 under LoadGen's server rule against Poisson rate"
Y_TITLE = "p99, LoadGen's server rule (ms)"
# A probe passes only when its run is VALID at the bound (flows/sweeps/peak.py probe_from); a
# failure may be INVALID for lateness, host load or output mismatches, with its p99 in bounds.
PASSED = "passed (VALID, within the bound)"
FAILED = "failed (INVALID, over the bound, no p99, or the run failed)"


def outcome(res: PeakResult) -> str:
    """What the search found, claiming a peak only between a passing and a failing rate."""
    if res.low is not None and res.high is not None:
        return f"peak {res.low:.3g} QPS (bracket {res.low:.3g}..{res.high:.3g})"
    if res.low is not None:
        what = "every probe passed" if all(p.passed for p in res.probes) else "no probe missed the bound"
        return f"no peak found: {what}, up to {res.low:.3g} QPS (a lower bound)"
    if res.high is not None:
        return f"no probe passed: the peak, if any, is below {res.high:.3g} QPS"
    if res.probes:
        return "no probe passed, none missed the bound: each failed for another reason"
    return "no probe ran"


def peak_qps_figure(res: PeakResult) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=f"{TITLE}: {outcome(res)}", xaxis_title="target rate (QPS)", yaxis_title=Y_TITLE, **LAYOUT)
    probes = sorted(res.probes, key=lambda p: p.rate)
    for passed, name, colour in ((True, PASSED, "#2a7"), (False, FAILED, "#c33")):
        pts = [p for p in probes if p.passed == passed]
        fig.add_scatter(
            x=[p.rate for p in pts],
            # a probe without a p99 (too few requests, the run failed) is drawn at the bound
            y=[p.p99_ms if p.p99_ms is not None else res.bound_ms for p in pts],
            mode="markers",
            name=name,
            marker=dict(color=colour, size=9),
            text=[f"run {p.run_id or '-'}; {p.validity or '-'}" + "".join(f"; {r}" for r in p.reasons) for p in pts],
        )
    drawn = [p for p in probes if p.p99_ms is not None]
    fig.add_scatter(
        x=[p.rate for p in drawn], y=[p.p99_ms for p in drawn], mode="lines", line=dict(color="#999"), showlegend=False
    )
    fig.add_hline(y=res.bound_ms, line_dash="dot", line_color="#555", annotation_text=f"bound {res.bound_ms:g} ms")
    if res.low is not None and res.high is not None:
        fig.add_vrect(x0=res.low, x1=res.high, fillcolor="#2a7", opacity=0.15, line_width=0)
    return fig
