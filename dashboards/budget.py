"""The ``relflow-bench budget`` chart: quality against milliseconds per prediction, one marker per
context size, the Pareto front joined by a line.

Each point's quality carries its 95% interval as an error bar (points whose bars overlap are not
ranked against each other: tasks/measure/pareto.py); front points are filled, dominated ones
hollow, and each is labelled with its grid values. Written as ``budget.html`` (plotly.js inline,
works offline) and ``budget.png`` through Kaleido and a Chrome/Chromium, as the dashboard's PNGs
(dashboards/report.py); with no browser the PNG is skipped and ``png_skipped`` says why.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import plotly.graph_objects as go

from dashboards.report import NO_BROWSER_FIX, PNG_SIZE, chrome_path

LAYOUT = dict(template="plotly_white", height=520, margin=dict(l=80, r=30, t=70, b=70))
FRONT_COLOUR, OTHER_COLOUR = "#2a7", "#888"


class BudgetPointLike(Protocol):
    index: int
    label: str
    quality: float | None
    quality_low: float | None
    quality_high: float | None
    ms_per_prediction: float | None
    on_front: bool
    ranked: bool


def budget_figure(
    points: Sequence[BudgetPointLike], quality_name: str, higher_is_better: bool, title: str = ""
) -> go.Figure:
    """Quality (y, with its interval) against end-to-end ms per prediction (x)."""
    fig = go.Figure()
    better = "higher" if higher_is_better else "lower"
    fig.update_layout(
        title=title or "Quality against cost per context size",
        xaxis_title="end-to-end predict ms per prediction (lower is cheaper)",
        yaxis_title=f"{quality_name} ({better} is better), 95% interval",
        **LAYOUT,
    )
    ranked = [p for p in points if p.ranked]
    for on_front, name, colour, symbol in (
        (True, "Pareto front", FRONT_COLOUR, "circle"),
        (False, "dominated", OTHER_COLOUR, "circle-open"),
    ):
        pts = [p for p in ranked if p.on_front == on_front]
        if not pts:
            continue
        q = [p.quality or 0.0 for p in pts]
        fig.add_scatter(
            x=[p.ms_per_prediction for p in pts],
            y=q,
            mode="markers+text",
            name=name,
            text=[f"#{p.index + 1}" for p in pts],
            textposition="top right",
            hovertext=[p.label for p in pts],
            marker=dict(color=colour, size=11, symbol=symbol, line=dict(width=2, color=colour)),
            error_y=dict(
                type="data",
                symmetric=False,
                array=[
                    (p.quality_high - v) if p.quality_high is not None else 0.0 for p, v in zip(pts, q, strict=True)
                ],
                arrayminus=[
                    (v - p.quality_low) if p.quality_low is not None else 0.0 for p, v in zip(pts, q, strict=True)
                ],
                color=colour,
            ),
        )
    line = sorted((p for p in ranked if p.on_front), key=lambda p: p.ms_per_prediction or 0.0)
    if len(line) > 1:
        fig.add_scatter(
            x=[p.ms_per_prediction for p in line],
            y=[p.quality for p in line],
            mode="lines",
            line=dict(color=FRONT_COLOUR, dash="dot"),
            showlegend=False,
            hoverinfo="skip",
        )
    legend = "<br>".join(f"#{p.index + 1}: {p.label}" for p in points)
    fig.add_annotation(
        text=legend,
        xref="paper",
        yref="paper",
        x=1.0,
        y=0.0,
        xanchor="right",
        yanchor="bottom",
        showarrow=False,
        align="left",
        font=dict(size=10),
        bgcolor="rgba(255,255,255,0.8)",
    )
    return fig


@dataclass(frozen=True)
class Written:
    files: list[Path]  # the HTML, then the PNG when one was drawn
    png_skipped: str | None = None


def write_chart(fig: go.Figure, out: Path, stem: str, *, png: bool = True) -> Written:
    """``<stem>.html`` and, with a browser, ``<stem>.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    page = out / f"{stem}.html"
    fig.write_html(page, include_plotlyjs=True, full_html=True)
    if not png:
        return Written([page])
    set_path = os.environ.get("BROWSER_PATH")
    if set_path and not Path(set_path).is_file():
        return Written([page], f"no PNG: BROWSER_PATH={set_path} is not a file; {NO_BROWSER_FIX}.")
    browser = chrome_path()
    if browser and not set_path:
        os.environ["BROWSER_PATH"] = browser  # Kaleido reads it
    import plotly.io as pio
    from kaleido.errors import ChromeNotFoundError

    image = out / f"{stem}.png"
    try:
        pio.write_image(fig, image, **PNG_SIZE)
    except (ChromeNotFoundError, RuntimeError) as err:
        if not isinstance(err, ChromeNotFoundError) and "requires Google Chrome" not in str(err):
            raise
        image.unlink(missing_ok=True)
        return Written([page], f"no PNG: Kaleido found no Chrome/Chromium; {NO_BROWSER_FIX}.")
    return Written([page, image])
