"""Pure functions from ``StoredRun``s to Plotly figures (no MLflow, no files).

Each function takes the runs of one experiment, oldest first, and returns a figure; when the
runs hold nothing to draw (no compile variants, no packing pairs) the figure says so in a
note instead of failing, so a dashboard always renders.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboards.compare import IDENTITY_PARAMS
from dashboards.history import HISTORY_METRICS, HistoryStep, series
from tasks.measure import keys as K
from tasks.tracking.reader import StoredRun

LAYOUT = dict(template="plotly_white", height=460, margin=dict(l=70, r=30, t=70, b=110))


def benchmark_runs(runs: Sequence[StoredRun]) -> list[StoredRun]:
    """FINISHED runs that carry benchmark metrics (report parents and dashboards carry none)."""
    return [r for r in runs if r.status == "FINISHED" and K.E2E_PREDICT_ROWS_PER_S in r.metrics]


def _note(fig: go.Figure, text: str) -> go.Figure:
    fig.add_annotation(
        text=text, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5, font=dict(size=14, color="#666")
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def varying_params(runs: Sequence[StoredRun]) -> list[str]:
    """Spec params that differ between the runs: what explains their differences."""
    keys = sorted({k for r in runs for k in r.params} - IDENTITY_PARAMS)
    return [k for k in keys if len({r.params.get(k) for r in runs}) > 1]


SWEEP_TAG = "relflow.sweep."
# Params that pick the compile variant: the eager vs compiled chart compares across these.
COMPILE_PARAMS = {"run.compile.encoders", "run.compile.pools"}


def config_label(run: StoredRun, keys: Sequence[str]) -> str:
    """The run's configuration: its sweep tags (``relflow.sweep.<key>=<value>``), else the
    values of the params that vary between the runs shown; the run id only as a last resort."""
    sweep = sorted((k[len(SWEEP_TAG) :], v) for k, v in run.tags.items() if k.startswith(SWEEP_TAG))
    pairs = sweep or [(k, run.params.get(k, "(unset)")) for k in keys]
    if not pairs:
        return run.label
    return ", ".join(f"{k.removeprefix('run.')}={v}" for k, v in pairs)


def _hover(run: StoredRun, keys: Sequence[str]) -> str:
    lines = [f"<b>{run.label}</b>"] + [f"{k} = {run.params.get(k, '(unset)')}" for k in keys]
    return "<br>".join(lines)


def stage_breakdown(runs: Sequence[StoredRun]) -> go.Figure:
    """Stacked bars per run, labelled by configuration: where the predict seconds go, stage
    by stage (training epochs are another phase and are not stacked in)."""
    runs = benchmark_runs(runs)
    fig = go.Figure()
    fig.update_layout(
        title="Predict stage breakdown per run (seconds, stacked = e2e.predict.seconds)",
        barmode="stack",
        yaxis_title="seconds",
        **LAYOUT,
    )
    if not runs:
        return _note(fig, "no FINISHED benchmark runs")
    keys = varying_params(runs)
    labels = [config_label(r, keys) for r in runs]
    if len(set(labels)) < len(labels):  # repeated configurations: tell the runs apart
        labels = [f"{lab} ({r.run_id[:6]})" for lab, r in zip(labels, runs, strict=True)]
    for stage in K.STAGES:
        fig.add_bar(
            name=stage,
            x=labels,
            y=[r.metrics.get(K.stage_seconds(stage, "predict"), 0.0) for r in runs],
            hovertext=[_hover(r, keys) for r in runs],
        )
    fig.update_xaxes(tickangle=-35)
    return fig


def compile_variant(run: StoredRun) -> str:
    """eager / encoders / pools / encoders+pools, with the Inductor cache state when tagged."""
    variant = run.tags.get("relflow.variant")
    if variant is None:
        enc = run.params.get("run.compile.encoders", "False").lower() == "true"
        pools = run.params.get("run.compile.pools", "False").lower() == "true"
        variant = "+".join(n for n, on in (("encoders", enc), ("pools", pools)) if on) or "eager"
    cache = run.tags.get("relflow.compile_cache")
    return f"{variant} ({cache})" if cache in ("cold", "warm") else variant


def _median_range(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def first_call_vs_steady(runs: Sequence[StoredRun]) -> go.Figure:
    """Per compile variant: first-call seconds (compile included) next to steady rows/s.

    Like with like: runs are grouped by every other param that varies (batch size, packing,
    ...), one bar series per configuration; a median is only ever taken within one."""
    runs = benchmark_runs(runs)
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("first call (s, includes compilation)", "steady-state throughput (rows/s)")
    )
    fig.update_layout(
        title="First call vs steady state, eager vs compiled, per configuration (median, bars = range over runs)",
        barmode="group",
        **LAYOUT,
    )
    if not runs:
        return _note(fig, "no FINISHED benchmark runs")
    others = [k for k in varying_params(runs) if k not in COMPILE_PARAMS]
    groups = compile_groups(runs)
    order = sorted({v for by_variant in groups.values() for v in by_variant}, key=lambda v: (v != "eager", v))
    for config, by_variant in sorted(groups.items()):
        name = ", ".join(f"{k.removeprefix('run.')}={v}" for k, v in zip(others, config, strict=True)) or "all runs"
        present = [v for v in order if v in by_variant]
        for col, key in ((1, K.FIRST_CALL_SECONDS), (2, K.STEADY_ROWS_PER_S)):
            med, lo, hi = zip(
                *(_median_range([r.metrics.get(key, 0.0) for r in by_variant[v]]) for v in present), strict=True
            )
            fig.add_bar(
                x=present,
                y=med,
                row=1,
                col=col,
                name=name,
                legendgroup=name,
                showlegend=col == 1,
                error_y=dict(
                    type="data",
                    symmetric=False,
                    array=[h - m for h, m in zip(hi, med, strict=True)],
                    arrayminus=[m - low for m, low in zip(med, lo, strict=True)],
                ),
                hovertext=[f"{name}, {v}: {len(by_variant[v])} run(s)" for v in present],
            )
    if len(order) == 1:
        fig.add_annotation(
            text="only one compile variant here: run `relflow-bench compile-report` for the rest",
            showarrow=False,
            xref="paper",
            yref="paper",
            x=0.5,
            y=1.12,
            font=dict(color="#666"),
        )
    return fig


def compile_groups(runs: Sequence[StoredRun]) -> dict[tuple[str, ...], dict[str, list[StoredRun]]]:
    """Runs by configuration (the values of every varying param except the compile switches),
    then by compile variant."""
    others = [k for k in varying_params(runs) if k not in COMPILE_PARAMS]
    groups: dict[tuple[str, ...], dict[str, list[StoredRun]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        groups[tuple(r.params.get(k, "(unset)") for k in others)][compile_variant(r)].append(r)
    return {k: dict(v) for k, v in groups.items()}


def headline_quality(run: StoredRun) -> tuple[str, float] | None:
    name = K.HEADLINE_QUALITY.get(run.params.get("task.kind", "category"), "accuracy")
    value = run.metrics.get(K.quality(name))
    return None if value is None else (name, value)


def quality_vs_throughput(runs: Sequence[StoredRun]) -> go.Figure:
    """Each run: end-to-end rows/s against its headline quality; colour = batch size,
    symbol = packing; hover lists the spec params that differ between runs."""
    runs = [
        r
        for r in benchmark_runs(runs)
        if headline_quality(r) is not None and r.tags.get("relflow.quality_meaningful", "true") == "true"
    ]
    fig = go.Figure()
    fig.update_layout(
        title="Quality vs end-to-end throughput (trade-offs: truncation, batch size, packing)",
        xaxis_title="end-to-end predict rows/s (e2e.predict.rows_per_s)",
        **LAYOUT,
    )
    if not runs:
        return _note(fig, "no runs with meaningful quality (trained or from a checkpoint)")
    metric = headline_quality(runs[-1])[0]
    fig.update_layout(yaxis_title=metric)
    keys = varying_params(runs)
    groups: dict[tuple[str, str], list[StoredRun]] = defaultdict(list)
    for r in runs:
        groups[(r.params.get("run.batch_size", "?"), r.params.get("run.packing", "?"))].append(r)
    symbols = {"auto": "circle", "off": "square"}
    for (bs, packing), rs in sorted(groups.items(), key=lambda kv: (len(kv[0][0]), kv[0])):
        fig.add_scatter(
            x=[r.metrics[K.E2E_PREDICT_ROWS_PER_S] for r in rs],
            y=[headline_quality(r)[1] for r in rs],
            mode="markers",
            name=f"batch {bs}, packing {packing}",
            marker=dict(size=11, symbol=symbols.get(packing, "diamond")),
            hovertext=[_hover(r, keys) for r in rs],
            hoverinfo="text+x+y",
        )
    return fig


def packing_pairs(runs: Sequence[StoredRun]) -> list[tuple[float, float, str]]:
    """(occupancy, packed speedup, label) for configurations run with packing auto AND off.

    Runs pair when every spec param except ``run.packing`` (and output names) matches;
    the speedup is the ratio of median steady rows/s, auto over off.
    """
    by_config: dict[tuple, dict[str, list[StoredRun]]] = defaultdict(lambda: defaultdict(list))
    for r in benchmark_runs(runs):
        packing = r.params.get("run.packing")
        if packing not in ("auto", "off"):
            continue
        config = tuple(sorted((k, v) for k, v in r.params.items() if k != "run.packing" and k not in IDENTITY_PARAMS))
        by_config[config][packing].append(r)
    out = []
    for config, sides in by_config.items():
        if not sides["auto"] or not sides["off"]:
            continue
        auto = statistics.median(r.metrics.get(K.STEADY_ROWS_PER_S, 0.0) for r in sides["auto"])
        off = statistics.median(r.metrics.get(K.STEADY_ROWS_PER_S, 0.0) for r in sides["off"])
        occ = statistics.median(r.metrics.get(K.DATA_OCCUPANCY, 0.0) for r in sides["off"] + sides["auto"])
        params = dict(config)
        label = f"batch {params.get('run.batch_size', '?')}, {len(sides['auto'])}+{len(sides['off'])} runs"
        if off > 0:
            out.append((occ, auto / off, label))
    return sorted(out)


def occupancy_vs_packing(runs: Sequence[StoredRun]) -> go.Figure:
    """Occupancy (present / reserved coordinates) against the packed path's speedup."""
    pairs = packing_pairs(runs)
    fig = go.Figure()
    fig.update_layout(
        title="Occupancy vs packed speedup (steady rows/s, packing auto / off)",
        xaxis_title="data.occupancy (present / reserved coordinates)",
        yaxis_title="speedup (auto / off)",
        **LAYOUT,
    )
    if not pairs:
        return _note(fig, "no configuration run with both run.packing=auto and off: sweep --grid run.packing=auto,off")
    fig.add_scatter(
        x=[p[0] for p in pairs],
        y=[p[1] for p in pairs],
        mode="markers+text",
        text=[p[2] for p in pairs],
        textposition="top center",
        marker=dict(size=12),
    )
    fig.add_hline(y=1.0, line_dash="dot", line_color="#999")
    return fig


def history_figure(runs: Sequence[StoredRun], steps: Sequence[HistoryStep]) -> go.Figure:
    """Throughput over time for one host and spec, with detected steps marked."""
    # Throughput always; latency rows only when the runs are request-scenario runs.
    keys = [k for k in HISTORY_METRICS if not k.startswith(K.LATENCY_PREFIX) or series(runs, k)[0]]
    fig = make_subplots(
        rows=len(keys),
        cols=1,
        shared_xaxes=True,
        subplot_titles=[f"{k} ({'ms' if k.startswith(K.LATENCY_PREFIX) else 'rows/s'})" for k in keys],
    )
    fig.update_layout(
        title="History (one host fingerprint, one spec hash), detected steps marked",
        showlegend=False,
        **{**LAYOUT, "height": 560},
    )
    if not benchmark_runs(runs):
        return _note(fig, "no FINISHED benchmark runs")
    for row, key in enumerate(keys, start=1):
        kept, values = series(runs, key)
        fig.add_scatter(
            x=[r.started_at for r in kept],
            y=values,
            mode="lines+markers",
            row=row,
            col=1,
            hovertext=[f"{r.label}<br>git {r.tags.get('relflow.git_sha', '?')[:10]}" for r in kept],
        )
        for s in (s for s in steps if s.metric == key):
            colour = "#d62728" if s.kind == "regression" else "#2ca02c"
            x = s.after_run.started_at
            fig.add_shape(
                type="line",
                x0=x,
                x1=x,
                y0=0,
                y1=1,
                yref=f"y{'' if row == 1 else row} domain",
                xref=f"x{'' if row == 1 else row}",
                line=dict(color=colour, dash="dash"),
            )
            fig.add_annotation(
                x=x,
                y=1,
                yref=f"y{'' if row == 1 else row} domain",
                xref=f"x{'' if row == 1 else row}",
                showarrow=False,
                yanchor="bottom",
                text=f"{s.kind} x{s.step.ratio:.2f}",
                font=dict(color=colour),
            )
    return fig


def latency_cdf(runs: Sequence[StoredRun], cdfs: dict[str, list[float]]) -> go.Figure:
    """Request latency CDF per single_stream / server run (``latency.cdf_ms``: the latency
    at percentiles 0..100; runs without it show their p50/p90/p99/max points)."""
    fig = go.Figure()
    fig.update_layout(
        title="Request latency CDF (steady requests; cold first request apart)",
        xaxis_title="latency (ms, log)",
        yaxis_title="share of requests (%)",
        xaxis_type="log",
        **LAYOUT,
    )
    runs = [r for r in benchmark_runs(runs) if r.metrics.get(K.LATENCY_REQUESTS, 0) > 0]
    if not runs:
        return _note(fig, "no single_stream or server runs (run.scenario)")
    for r in runs:
        m = r.metrics
        scenario = r.params.get("run.scenario", "?")
        qps = f" @ {m[K.LATENCY_TARGET_QPS]:g} QPS" if K.LATENCY_TARGET_QPS in m else ""
        name = f"{r.label} {scenario}{qps} [{r.tags.get('relflow.validity', '?')}]"
        cdf = cdfs.get(r.run_id)
        if cdf:
            x, y = cdf, [100.0 * i / (len(cdf) - 1) for i in range(len(cdf))]
        else:
            pts = [(p, m.get(K.latency_request_ms(p))) for p in (50, 90, 99)]
            pts.append((100, m.get(K.LATENCY_REQUEST_MS_MAX)))
            x, y = [v for _, v in pts if v is not None], [p for p, v in pts if v is not None]
        fig.add_scatter(x=x, y=y, mode="lines", name=name, line_shape="hv")
        if "run.request.latency_bound_ms" in r.params and scenario == "server":
            fig.add_vline(x=float(r.params["run.request.latency_bound_ms"]), line_dash="dot", line_color="#888")
    return fig
