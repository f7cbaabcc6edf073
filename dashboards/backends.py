"""The backends report: pure functions from its runs to its table and chart.

``summarize`` turns the report's samples (one ``relflow-bench run`` per variant and round)
into one row per variant: medians over rounds (FAILED rounds give NaN figures), the
order-statistic 95% interval of the steady median from 6 rounds, and **e2e vs eager**: the
median over rounds of the variant's ``e2e.predict.rows_per_s`` over ``pytorch_eager_fp32``'s
in the same round (a round's runs are neighbours in time, so the paired ratio cancels the
host's slow drift that a ratio of two medians would carry), with its interval from 6
paired rounds (``tasks/measure/report.py`` ``ratio_interval``); ``to_markdown`` is the
table, ``backends_figure`` the chart. Left: steady rows/s per variant with its 95% CI and
end-to-end predict rows/s beside it; right: the headline quality's delta against the fp16
reference. ``rows_from_runs`` rebuilds the rows from the children of a
``relflow-bench backends-report`` parent (tag ``relflow.variant``) read from MLflow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tasks.measure import keys as K
from tasks.measure.report import (
    Cell,
    Group,
    RunSummary,
    Sample,
    interval_text,
    markdown_table,
    ratio_interval,
    slower_by_paired_ratio,
)
from tasks.measure.report import summarize as summarize_groups
from tasks.tracking.reader import StoredRun

REFERENCE_VARIANT = "pytorch_fp16"  # every variant's quality reference (flows/sweeps/backends_report.py)
EAGER_VARIANT = "pytorch_eager_fp32"  # what a compiled variant must not fall below unsaid
ROUND_TAG = "relflow.round"  # on each child: its interleaved round, for the paired ratios
SLOWER_TAG = "relflow.report.compiled_slower_than_eager"  # on the parent: the notes, "; "-joined
LAYOUT = dict(template="plotly_white", height=460, margin=dict(l=70, r=30, t=70, b=130))


def summarize(samples: Sequence[Sample], headline: str) -> list[dict[str, Cell]]:
    """One row per variant: medians over its rounds (FAILED rounds give NaN figures)."""

    def served(g: Group, ort_key: str, ckpt_key: str) -> float:
        # ONNX Runtime serves its own file; PyTorch variants load the checkpoint
        return g.median(ort_key if g.key[0].startswith("onnxruntime") else ckpt_key)

    def by_round(samples_of: Sequence[Sample], key: str) -> dict[int, float]:
        # round -1: a child from before rounds were tagged, which pairs with nothing
        return {s.round: s.metrics[key] for s in samples_of if s.round >= 0 and key in s.metrics}

    eager = [s for s in samples if s.variant == EAGER_VARIANT]
    eager_by = {key: by_round(eager, key) for key in (K.E2E_PREDICT_ROWS_PER_S, K.STEADY_ROWS_PER_S)}

    def paired(g: Group, field: str, key: str = K.E2E_PREDICT_ROWS_PER_S) -> float | None:
        ri = ratio_interval(by_round(g.samples, key), eager_by[key])
        if ri is None:
            return math.nan if field == "median" else None
        value: float | None = getattr(ri, field)
        return value

    def vs_eager(g: Group, field: str) -> float | None:
        return paired(g, field)

    def ci(g: Group, side: str) -> float | None:
        mi = g.interval(K.STEADY_ROWS_PER_S)
        return None if mi is None else (mi.low if side == "low" else mi.high)

    return summarize_groups(
        samples,
        {
            "rounds": lambda g: len(g.reports),
            "first_call_s": lambda g: g.median(K.FIRST_CALL_SECONDS),
            "steady_rows_per_s": lambda g: g.median(K.STEADY_ROWS_PER_S),
            "steady_ci_low": lambda g: ci(g, "low"),
            "steady_ci_high": lambda g: ci(g, "high"),
            "e2e_predict_rows_per_s": lambda g: g.median(K.E2E_PREDICT_ROWS_PER_S),
            "e2e_vs_eager": lambda g: vs_eager(g, "median"),
            "e2e_vs_eager_ci_low": lambda g: vs_eager(g, "low"),
            "e2e_vs_eager_ci_high": lambda g: vs_eager(g, "high"),
            "e2e_vs_eager_rounds": lambda g: vs_eager(g, "n"),
            # the steady note's figure: steady rows/s over eager's in the same round
            "steady_vs_eager_ci_low": lambda g: paired(g, "low", K.STEADY_ROWS_PER_S),
            "steady_vs_eager_ci_high": lambda g: paired(g, "high", K.STEADY_ROWS_PER_S),
            "batch_p99_ms": lambda g: g.median(K.compute("predict", "batch_ms.p99")),
            "quality": lambda g: g.median(K.quality(headline)),
            "delta_vs_reference": lambda g: g.median(K.QUALITY_DELTA_VS_REFERENCE),
            "file_bytes": lambda g: served(g, K.BACKEND_MODEL_BYTES, K.CHECKPOINT_BYTES),
            "load_s": lambda g: served(g, K.BACKEND_LOAD_SECONDS, K.CHECKPOINT_LOAD_SECONDS),
            "peak_rss_mib": lambda g: (
                max((r.metrics.get(K.HOST_PEAK_BYTES, 0.0) for r in g.reports), default=math.nan) / 2**20
            ),
            # a compiled variant's peak holds its compiler processes: the served process apart
            "peak_rss_excluding_compiler_mib": lambda g: (
                max((r.metrics.get(K.HOST_PEAK_EXCLUDING_COMPILER_BYTES, 0.0) for r in g.reports), default=math.nan)
                / 2**20
            ),
            "graph_breaks": lambda g: g.median(K.compute("predict", K.GRAPH_BREAKS_WARMUP)),
            "recompiles": lambda g: g.median(K.compute("predict", "recompiles")),
            "validity": lambda g: ",".join(sorted({s.validity for s in g.samples})),
            "run_ids": lambda g: [s.report.run_id if s.report else "" for s in g.samples],
        },
    )


def slower_than_eager(rows: Sequence[dict[str, Cell]]) -> list[str]:
    """A note for each compiled variant whose paired per-round steady ratio to eager fp32
    (each round's steady rows/s over eager's in that round) has a 95% interval wholly below 1:
    slower in the same rounds, whatever the host's drift between rounds (which unpaired
    intervals of the two medians carry, so they can overlap while every round is slower)."""
    return slower_by_paired_ratio(
        rows,
        label=lambda r: str(r["variant"]),
        is_candidate=lambda r: "compiled" in str(r["variant"]),
        baseline=EAGER_VARIANT,
        figure="steady rows/s",
        low="steady_vs_eager_ci_low",
        high="steady_vs_eager_ci_high",
    )


def _vs_eager_text(r: dict[str, Cell]) -> str:
    ratio = r["e2e_vs_eager"]
    if not isinstance(ratio, float) or math.isnan(ratio):
        return "-"  # no round where both this variant and eager fp32 finished
    n, low, high = r["e2e_vs_eager_rounds"], r["e2e_vs_eager_ci_low"], r["e2e_vs_eager_ci_high"]
    bounds = (low, high) if isinstance(low, float) and isinstance(high, float) else (None, None)
    return f"{ratio:.2f}x [{interval_text(*bounds, int(n) if isinstance(n, int | float) else 0, '.2f')}]"


def to_markdown(rows: Sequence[dict[str, Cell]], headline: str) -> str:
    header = [
        "variant",
        "first call s",
        "steady rows/s [95% CI]",
        "e2e predict rows/s",
        "e2e vs eager [95% CI]",
        "batch p99 ms",
        headline,
        "delta vs fp16 ref",
        "file bytes",
        "load s",
        "peak RSS MiB",
        "without compiler MiB",
        "graph breaks",
        "validity",
    ]
    table = markdown_table(
        header,
        (
            [
                str(r["variant"]),
                f"{r['first_call_s']:.2f}",
                f"{r['steady_rows_per_s']:,.0f} "
                f"[{interval_text(r['steady_ci_low'], r['steady_ci_high'], r['rounds'])}]",
                f"{r['e2e_predict_rows_per_s']:,.0f}",
                _vs_eager_text(r),
                f"{r['batch_p99_ms']:.1f}",
                f"{r['quality']:.4f}",
                # the reference is the fp16 checkpoint itself: its delta is 0 by construction
                f"{r['delta_vs_reference']:+.4f}"
                + (" (is the reference)" if r["variant"] == REFERENCE_VARIANT else ""),
                f"{r['file_bytes']:,.0f}",
                f"{r['load_s']:.3f}",
                f"{r['peak_rss_mib']:,.0f}",
                f"{r['peak_rss_excluding_compiler_mib']:,.0f}",
                f"{r['graph_breaks']:.0f}",
                str(r["validity"]),
            ]
            for r in rows
        ),
    )
    return "\n\n".join([table, *(f"Note: {n}." for n in slower_than_eager(rows))])


def rows_from_runs(runs: Sequence[StoredRun]) -> list[dict[str, Cell]]:
    """Report rows from FINISHED predict-mode children tagged ``relflow.variant`` (medians)."""
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
    # A store can hold several reports: a round pairs runs of one parent only, so each
    # (parent, round) gets its own number; children without a round tag pair with nothing (-1).
    slots = sorted({(r.tags["mlflow.parentRunId"], int(r.tags[ROUND_TAG])) for r in kids if ROUND_TAG in r.tags})
    number = {slot: i for i, slot in enumerate(slots)}

    def round_of(r: StoredRun) -> int:
        return number[(r.tags["mlflow.parentRunId"], int(r.tags[ROUND_TAG]))] if ROUND_TAG in r.tags else -1

    samples = [Sample(r.tags["relflow.variant"], round_of(r), RunSummary.from_record(r)) for r in kids]
    return summarize(samples, K.HEADLINE_QUALITY.get(kind, "accuracy"))


def backends_figure(rows: Sequence[dict[str, Cell]], headline: str = "accuracy") -> go.Figure:
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
