"""The floor ledger as a figure: one bar per stage, the stage's rate over its floor's.

Draws the latest benchmark run that logged ``floor.<stage>.fraction``
(tasks/run/floors.py): 1.0 (the dashed line) is the plainest way this host does the same
work, so a short bar is where the serving path leaves the most on the table. Preprocess has no
single floor; its input rate and share are in the title. Fractions against an untrusted ledger
(``tasks.run.floors.untrusted``: a busy host's floors, a stage faster than its floor) are
drawn grey and hatched, with the reasons in the title.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from dashboards.figures import LAYOUT, _note, benchmark_runs
from tasks.measure import keys as K
from tasks.measure.floor_trust import untrusted
from tasks.tracking.reader import StoredRun


def floor_ledger(runs: Sequence[StoredRun]) -> go.Figure:
    """Bars of ``floor.<stage>.fraction`` for the latest run that has them."""
    fig = go.Figure()
    fig.update_layout(yaxis_title="stage rate / floor rate (1.0 = at the floor)", **LAYOUT)
    with_floors = [r for r in benchmark_runs(runs) if any(K.floor_fraction(s) in r.metrics for s in K.FLOOR_STAGES)]
    if not with_floors:
        fig.update_layout(title="Floor ledger")
        return _note(fig, "no run with floor.<stage>.fraction (runs before the floor ledger)")
    run = with_floors[-1]
    stages = [s for s in K.FLOOR_STAGES if K.floor_fraction(s) in run.metrics]
    values = [run.metrics[K.floor_fraction(s)] for s in stages]
    doubts = untrusted(run.metrics)
    # Grey, hatched bars: a fraction against a floor that is not one must not read like a real one.
    marker = {"color": "#bbbbbb", "pattern": {"shape": "/"}} if doubts else {}
    name = "vs floor (untrusted)" if doubts else "vs floor"
    fig.add_bar(x=stages, y=values, text=[f"{v:.1%}" for v in values], textposition="outside", name=name, marker=marker)
    fig.add_hline(y=1.0, line_dash="dash", line_color="#666")
    pre = run.metrics.get(K.FLOOR_PREPROCESS_INPUT_BYTES_PER_S)
    note = (
        f"; preprocess {pre / 1e6:,.1f} MB/s of input, {run.metrics.get(K.FLOOR_PREPROCESS_SHARE, 0.0):.0%} of e2e"
        if pre is not None
        else ""
    )
    fig.update_layout(title=f"Floor ledger of run {run.run_id[:8]} (predict){note}")
    if doubts:
        fig.update_layout(title=f"{fig.layout.title.text}<br>UNTRUSTED floors: {'; '.join(doubts)}")
    return fig
