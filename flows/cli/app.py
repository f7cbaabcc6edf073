"""``relflow-bench``: the command line (the app, ``run``, ``compile-report``, ``data``).

``sweep`` lives in ``flows/cli/sweep.py``, ``serve`` in ``flows/cli/serve.py``, the report commands in
``flows/cli/reports.py``, ``export``/``quantize``/``backends-report`` in
``flows/cli/backends.py``, the plumbing all of them share (consoles, exit codes) in
``flows/cli/common.py``. Prefect is imported only once a command needs it, so
``--help`` is instant and Prefect's log level can be set from ``--debug`` first.
"""

from __future__ import annotations

import atexit
import gc
import json
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, ProgressColumn, SpinnerColumn, Task, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from flows.cli import temporary_server
from flows.cli.backends import backends_report_cmd, export_cmd, models_report_cmd
from flows.cli.budget import budget_cmd
from flows.cli.common import (
    DEFAULT_SPEC,
    INTERRUPTED_EXIT,
    console,
    fail,
    handle_run_error,
    hide_user_error_logs,
    install_interrupts,
    out,
    pairs,
    show_table,
    start_run_command,
)
from flows.cli.floors import floors_cmd
from flows.cli.noise import noise_cmd
from flows.cli.peak import peak_qps_cmd
from flows.cli.quantize import quantize_cmd
from flows.cli.relbench_init import relbench_init_cmd
from flows.cli.reports import compare_cmd, dashboard_cmd, history_cmd, ui_cmd
from flows.cli.serve import serve_cmd
from flows.cli.sweep import sweep_cmd
from tasks.measure.clock import wall_clock
from tasks.runtime.masking import mask_log_secrets
from tasks.runtime.progress import Count

app = typer.Typer(
    help="Benchmark relational (nested-schema) transformers over the complete workload: "
    "retrieve -> preprocess -> tensorize -> compute -> write, tracked in MLflow.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
data_app = typer.Typer(help="Generate benchmark data.", no_args_is_help=True)
app.add_typer(data_app, name="data")


@app.command()
def run(
    spec: Annotated[
        Path, typer.Argument(help="Benchmark spec YAML (default: the TPC-H orders workload).")
    ] = DEFAULT_SPEC,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override a spec key, e.g. --set run.batch_size=512 or "
            "--set lineitem.max_length=2 (branches by name). Repeatable; validated like the file.",
        ),
    ] = None,
    scale: Annotated[
        float | None,
        typer.Option(help="TPC-H scale factor for generated data (same as --set source.generate.tpch.scale=S)."),
    ] = None,
    strict: Annotated[
        bool, typer.Option(help="Exit 3 when the run is INVALID (too little steady state, recompiles, quality floor).")
    ] = False,
    parent_run: Annotated[
        str | None, typer.Option(help="Record this run as a child of an existing MLflow run id (sweeps, reports).")
    ] = None,
    tag: Annotated[list[str] | None, typer.Option(help="Extra MLflow tag key=value on the run. Repeatable.")] = None,
    json_out: Annotated[
        Path | None,
        typer.Option("--json", help="Also write the run summary (metrics, stages, paths) to this JSON file."),
    ] = None,
    profile: Annotated[
        bool,
        typer.Option(
            help="Record torch.profiler over a few steady batches per phase (same as --set run.profile=true)."
        ),
    ] = False,
    spec_dir: Annotated[
        Path | None,
        typer.Option(
            help="Folder that relative source.tables paths are read from (default: the spec "
            "file's folder; sweeps pass their base spec's)."
        ),
    ] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks and Prefect's logs.")] = False,
) -> None:
    """Run one benchmark: five timed stages as a Prefect flow, recorded as one MLflow run."""
    overrides = start_run_command(debug, set_, scale) + (["run.profile=true"] if profile else [])
    try:
        summary = _run_benchmark(
            spec,
            overrides,
            pairs(tag or [], "--tag"),
            parent_run,
            debug,
            spec_dir.resolve() if spec_dir else spec.resolve().parent,
        )
    except (Exception, KeyboardInterrupt, SystemExit) as err:
        handle_run_error(err, debug, "the MLflow run was ended KILLED and partial outputs were removed.")
    report(summary)
    if json_out is not None:
        json_out.write_text(json.dumps(summary, indent=2, default=str))
    if summary["validity"] == "INVALID" and strict:
        raise typer.Exit(3)


def _run_benchmark(
    path: Path, overrides: list[str], tags: dict[str, str], parent_run: str | None, debug: bool, tables_dir: Path
) -> dict[str, Any]:
    """Check every input (and generate data) before Prefect starts, then run the flow with a
    progress line; returns the flow's summary."""
    from tasks.run.checks.preflight import check_settings
    from tasks.spec import load_spec

    # Spec and settings first, before torch, Prefect and MLflow are imported (10+ s): bad
    # input exits 2 in about a second.
    s = load_spec(path, overrides)
    check_settings(s)
    temporary_server.configure()  # before the flow's first Prefect call starts that server
    from flows.benchmark import benchmark
    from tasks.run.checks.plan import plan

    mask_log_secrets()  # with --debug too: Prefect's and MLflow's log lines show URIs masked
    if not debug:
        hide_user_error_logs()
    # Bad input fails in a second, not after the server's start-up; the flow repeats the cheap
    # checks.
    checked = plan(s, tables_dir)
    for note in checked.warnings:
        console.print(f"[yellow]warning:[/] {escape(note)}")
    if checked.generated:
        console.print(f"generated TPC-H data in {checked.data_seconds:.1f} s")
    launched = wall_clock()
    with _progress_line(s.name), temporary_server.recorded(benchmark) as flow:
        return flow(
            spec=s.to_dict(), spec_dir=str(tables_dir), launched_at=launched, parent_run_id=parent_run, tags=tags
        )


@dataclass
class _Shown:
    """What the progress line shows besides its description: the phase's count (read, never
    written, by the render), when it began on the display's clock, and the latest projection."""

    count: Count | None = None
    began: float = 0.0
    projection: str = ""
    printers: list[threading.Thread] = field(default_factory=list)


class _CountColumn(ProgressColumn):
    """Batches (or requests) done of total, rows/s and time left of the open count, computed
    when Rich redraws (its refresh thread), never on the thread that runs the batches."""

    def __init__(self, shown: _Shown, now: Callable[[], float] = wall_clock) -> None:
        super().__init__()
        self.shown, self.now = shown, now

    def render(self, task: Task) -> Text:
        return Text(count_text(self.shown.count, self.now() - self.shown.began))


def count_text(c: Count | None, elapsed: float) -> str:
    """``120/~480 batches (train), 5,230 rows/s, 0:01:32 left``: ``~`` an estimated total,
    ``>=`` a lower bound (single_stream runs until both of its minimums), ``?`` unknown."""
    if c is None:
        return ""
    if c.total is None:
        total = "?"
    elif c.exact:
        total = f"{c.total:,}"
    else:
        total = f"{'>=' if c.unit == 'requests' else '~'}{c.total:,}"
    text = f"{c.done:,}/{total} {c.unit} ({c.phase})"
    if elapsed > 0 and c.done:
        text += f", {c.rows / elapsed:,.0f} rows/s"
        if c.total is not None and c.total >= c.done:
            left = (c.total - c.done) * elapsed / c.done
            text += f", {'~' if not c.exact else ''}{timedelta(seconds=round(left))} left"
    return text


REFRESH_PER_S = 4  # redraws a second (Rich's default is 10): bench_progress.py prices one


def progress_bar(con: Console, shown: _Shown) -> Progress:
    """The line's columns: spinner, what runs now, the count, elapsed; redrawn by Rich's
    refresh thread ``REFRESH_PER_S`` times a second, off the thread that runs the batches."""
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        _CountColumn(shown),
        TimeElapsedColumn(),
        console=con,
        transient=True,
        refresh_per_second=REFRESH_PER_S,
    )


@contextmanager
def _progress_line(name: str, shown_on: Console | None = None) -> Iterator[None]:
    """A transient line on stderr naming the current phase, chunk, epoch and stage, with the
    phase's count (batches or requests done of total, rows/s, time left) and, once made, the
    run's projection, printed as it is made. Only on a terminal: elsewhere (a pipe, a log file,
    CI) nothing is shown and nothing listens, so the run's loops count nothing."""
    from tasks.runtime import progress

    con = shown_on or console
    if not con.is_terminal:
        yield
        return
    shown = _Shown()
    with progress_bar(con, shown) as bar:
        job = bar.add_task(f"{name}: starting Prefect", total=None)

        def show(event: str, info: dict[str, Any]) -> None:
            if event == "phase":
                bar.update(job, description=f"{name}: {info['name']}")
            elif event == "stage":
                extra = f" ({info['phase']})" if "phase" in info else ""
                epoch = f" epoch {info['epoch'] + 1}" if "epoch" in info else ""
                bar.update(job, description=f"{name}: chunk {info['chunk'] + 1}{epoch} {info['name']}{extra}")
            elif event == "count":
                shown.count, shown.began = info["count"], wall_clock()
            elif event == "projection":  # printed above the line by a thread of its own, off the loop's
                shown.projection = str(info["text"])
                line = f"[bold]{escape(name)}[/]: {escape(shown.projection)}"
                printer = threading.Thread(target=bar.console.print, args=(line,), daemon=True)
                printer.start()
                shown.printers.append(printer)

        unsubscribe = progress.subscribe(show)
        try:
            yield
        finally:
            unsubscribe()
            for printer in shown.printers:  # before the line goes: each projection stays printed
                printer.join(timeout=5)


def _latency_line(m: dict[str, float]) -> str:
    from tasks.measure import keys as K

    # encode is a step only where a library owns cell encoding (relational_transformers)
    steps = ("retrieve", "preprocess", "encode", "tensorize", "compute", "calibrate", "write", "queue")
    shares = ", ".join(
        f"{s} {m.get(K.latency_step_share(s), 0.0):.0%}" for s in steps if s != "encode" or K.latency_step_share(s) in m
    )
    qps = (
        f", {m[K.LATENCY_ACHIEVED_QPS]:.1f} QPS achieved of {m[K.LATENCY_TARGET_QPS]:g}"
        if K.LATENCY_TARGET_QPS in m
        else ""
    )
    return (
        f"latency              {int(m[K.LATENCY_REQUESTS]):,} requests in "
        f"{m[K.LATENCY_DURATION_SECONDS]:.1f} s{qps}: p50 {m.get(K.latency_request_ms(50), 0):.2f} "
        f"ms, p90 {m.get(K.latency_request_ms(90), 0):.2f}, p99 "
        f"{m.get(K.latency_request_ms(99), 0):.2f}, max {m.get(K.LATENCY_REQUEST_MS_MAX, 0):.2f}; "
        f"cold first {m.get(K.LATENCY_FIRST_REQUEST_MS, 0):.1f} ms\n"
        f"                     early stopping: {_early_stopping(m)}\n"
        f"                     shares: {shares}"
    )


def _projection_line(m: dict[str, float]) -> str:
    """The run's projected timed region (made after its first steady batches) beside what it took."""
    from tasks.measure import keys as K

    again = f", re-projected {m[K.RUN_REPROJECTED_SECONDS]:,.1f} s" if K.RUN_REPROJECTED_SECONDS in m else ""
    estimated = "" if m.get(K.RUN_PROJECTED_EXACT) else " (estimated counts)"
    return (
        f"projection           {m[K.RUN_PROJECTED_SECONDS]:,.1f} s of timed region projected "
        f"{m[K.RUN_PROJECTED_AT_SECONDS]:,.1f} s in{estimated}{again}; it took "
        f"{m.get(K.HARNESS_REGION_SECONDS, 0.0):,.1f} s"
    )


def _first_call_line(m: dict[str, float]) -> str:
    """The first call, and whether its compiles came from the compiler's on-disk cache."""
    from tasks.measure import keys as K

    hits = int(m.get(K.COMPILE_CACHE_HITS, 0))
    cache = f"; {hits} compiled graphs from the compiler's cache: not a cold compile" if hits else ""
    return (
        f"compute first call   {m[K.FIRST_CALL_SECONDS] * 1e3:,.1f} ms "
        f"(steady batch p50 {m[K.compute('predict', 'batch_ms.p50')]:.1f} ms{cache})"
    )


def _early_stopping(m: dict[str, float]) -> str:
    """The early-stopping estimates (absent when too few requests) and issue lateness."""
    from tasks.measure import keys as K

    parts = [
        f"p{q} {m[K.latency_early_stopping(q)]:.2f} ms"
        if K.latency_early_stopping(q) in m
        else f"p{q} n/a (too few requests)"
        for q in (90, 99)
    ]
    if K.LATENCY_ISSUE_LATENESS_MS_P99 in m:
        parts.append(
            f"issue lateness p50 {m[K.LATENCY_ISSUE_LATENESS_MS_P50]:.3f} ms, p99 "
            f"{m[K.LATENCY_ISSUE_LATENESS_MS_P99]:.3f}, max {m[K.LATENCY_ISSUE_LATENESS_MS_MAX]:.3f}"
        )
    return "; ".join(parts)


def _vs_floor(m: dict[str, float], phase: str, stage: str, trusted: bool) -> str:
    """The predict stage's ``floor.<stage>.fraction`` (tasks/run/floors.py), or blank;
    marked when the ledger is not to be trusted (the reasons follow the table)."""
    from tasks.measure import keys as K

    value = m.get(K.floor_fraction(stage)) if phase == "predict" else None
    if value is None:
        return ""
    return f"{value:.1%}" if trusted else f"[yellow]{value:.1%}*"


def report(summary: dict[str, Any]) -> None:
    """What ``run`` prints after a run: the stage table, the repeats, one line per figure
    (``summary_lines``), and the profiled ops when the run was profiled."""
    from tasks.measure import keys as K
    from tasks.measure.floor_trust import untrusted
    from tasks.measure.records import describe_repeats

    m = summary["metrics"]
    floor_doubts = untrusted(m)
    show_table(stage_table(summary, trusted=not floor_doubts))
    if floor_doubts:
        out.print("[yellow]* vs floor untrusted: " + "; ".join(floor_doubts))
    for key, label in ((K.E2E_PREDICT_ROWS_PER_S, "e2e predict"), (K.STEADY_ROWS_PER_S, "compute steady")):
        text = describe_repeats(m, key)
        if text:
            out.print(f"{label + ' repeats':<21} {text}")
    out.print("\n".join(summary_lines(summary)))
    for phase, ops in (summary.get("profile") or {}).items():
        show_table(top_ops_table(phase, ops))


def stage_table(summary: dict[str, Any], *, trusted: bool) -> Table:
    """Each phase's stages, then its end-to-end row (the two phases are never summed)."""
    from tasks.measure import keys as K

    m = summary["metrics"]
    table = Table(title="Stages (training epochs and predict passes are separate phases)", title_justify="left")
    for col in ("phase", "stage", "seconds", "root rows", "rows/s", "share of phase", "vs floor"):
        table.add_column(col, justify="left" if col in ("phase", "stage") else "right")
    for phase in K.PHASES:
        rows = [r for r in summary["stages"] if r["phase"] == phase]
        if not rows:
            continue
        for row in rows:
            table.add_row(
                phase,
                row["stage"],
                f"{row['seconds']:.3f}",
                f"{row['rows']:,}",
                f"{row['rows_per_s']:,.0f}",
                f"{row['share']:.1%}",
                _vs_floor(m, str(row["phase"]), str(row["stage"]), trusted),
            )
        label = "end-to-end predict (headline)" if phase == "predict" else "end-to-end train (trained rows)"
        table.add_row(
            f"[bold]{phase}",
            f"[bold]{label}",
            f"[bold]{m[K.e2e(phase, 'seconds')]:.3f}",
            f"{int(m[K.e2e(phase, 'rows')]):,}",
            f"[bold]{m[K.e2e(phase, 'rows_per_s')]:,.0f}",
            "100%",
            "",
            end_section=True,
        )
    return table


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """One line per figure after the stage table: compute, data, quality, memory, host, outputs,
    latency and calibration where the run has them, validity and where the run is recorded."""
    from tasks.measure import keys as K

    m = summary["metrics"]
    q = summary["quality_metric"]
    lines = [
        _first_call_line(m),
        f"recompiles           {int(m.get(K.compute('predict', 'recompiles'), 0))} in predict's steady window"
        + (f", {int(m[K.compute('train', 'recompiles')])} in train's" if K.compute("train", "recompiles") in m else ""),
        f"compute steady       {m[K.STEADY_ROWS_PER_S]:,.0f} rows/s (predict)"
        + (f", {m[K.TRAIN_STEADY_ROWS_PER_S]:,.0f} rows/s (train)" if K.TRAIN_STEADY_ROWS_PER_S in m else ""),
    ]
    if K.compute("predict", K.MFU) in m:
        train = f", {m[K.compute('train', K.MFU)]:.2%} train" if K.compute("train", K.MFU) in m else ""
        lines.append(
            f"compute MFU          {m[K.compute('predict', K.MFU)]:.2%} predict{train} of a "
            f"{m[K.HOST_PEAK_FLOPS_PER_S] / 1e9:,.1f} GFLOP/s matmul peak"
        )
    if K.DATA_OCCUPANCY in m:
        data = (
            f"occupancy {m[K.DATA_OCCUPANCY]:.1%} "
            f"({int(m[K.DATA_COORDS_PRESENT]):,} of {int(m[K.DATA_COORDS_RESERVED]):,} coordinates)"
        )
    else:  # no reserved layout (relational-transformers): the padding is the batches line's
        data = f"{int(m[K.DATA_COORDS_PRESENT]):,} present coordinates (no reserved layout)"
    lines.append(f"data                 {data}, {int(m[K.DATA_OVERFLOW_DROPPED]):,} rows dropped by overflow")
    if K.DATA_PADDED_COORDS in m:
        lines.append(
            f"batches              {int(m[K.DATA_PADDED_COORDS]):,} coordinates materialised per "
            f"pass, batch occupancy p50 {m[K.DATA_BATCH_OCCUPANCY_P50]:.1%} "
            f"min {m[K.DATA_BATCH_OCCUPANCY_MIN]:.1%}"
        )
    if K.quality(q) in m:
        base = m.get(K.quality("majority_rate"))
        note = f" (majority class {base:.3f})" if base is not None else ""
        if not summary["quality_meaningful"]:
            note += " [untrained weights: not meaningful, speed run]"
        lines.append(f"quality              {q} {m[K.quality(q)]:.4f}{note}")
    for metric in (k.removeprefix("relbench.") for k in m if k in (K.relbench("roc_auc"), K.relbench("nmae"))):
        bases = ", ".join(
            f"{b} {m[K.quality_baseline(b, metric)]:.4f}" for b in K.BASELINES if K.quality_baseline(b, metric) in m
        )
        lines.append(
            f"relbench             {metric} {m[K.relbench(metric)]:.4f} on {int(m.get(K.RELBENCH_TEST_ROWS, 0)):,} "
            f"test rows (baselines: {bases})"
        )
    lines += [
        f"memory               host peak {m[K.HOST_PEAK_BYTES] / 2**20:,.0f} MiB "
        "(this process and its children: loader workers, compiler)",
        f"host                 other processes used {m.get(K.HOST_OTHER_CPU_FRACTION_BEFORE, 0):.0%} of "
        f"the cores just before the timed region, {m.get(K.HOST_OTHER_CPU_FRACTION, 0):.0%} during it",
        f"predictions          {summary['output_path']} ({int(m[K.OUTPUT_BYTES]):,} bytes)",
    ]
    if K.LATENCY_REQUESTS in m:  # single_stream / server (tasks/run/scenarios)
        lines.append(_latency_line(m))
    if K.quality("nll") in m:
        lines.append(
            f"calibration          T {m.get(K.CALIBRATION_TEMPERATURE, 1.0):.3f}: nll "
            f"{m[K.quality('uncalibrated.nll')]:.4f} -> {m[K.quality('nll')]:.4f}, ece "
            f"{m[K.quality('uncalibrated.ece')]:.4f} -> {m[K.quality('ece')]:.4f}, brier "
            f"{m[K.quality('uncalibrated.brier')]:.4f} -> {m[K.quality('brier')]:.4f}"
        )
    if summary.get("checkpoint_path"):
        lines.append(f"checkpoint           {summary['checkpoint_path']}")
    if K.RUN_PROJECTED_SECONDS in m:  # tasks/measure/projection.py
        lines.append(_projection_line(m))
    lines += [
        f"harness start-up     {m[K.HARNESS_STARTUP_SECONDS]:.1f} s (not in e2e)",
        (
            "validity             VALID"
            if summary["validity"] == "VALID"
            else "validity             [bold red]INVALID[/]: " + "; ".join(summary["invalid_reasons"])
        ),
        f"MLflow               experiment '{summary['experiment']}', run {summary['run_id']}",
        f"                     {summary['tracking_uri']}",
    ]
    return lines


def top_ops_table(phase: str, ops: list[dict[str, Any]]) -> Table:
    """The profiled steady batches' top ops of one phase (``run --profile``)."""
    top = Table(title=f"Top ops, {phase} (profiled steady batches)", title_justify="left")
    for col in ("op", "calls", "self CPU ms", "self CUDA ms", "share"):
        top.add_column(col, justify="left" if col == "op" else "right")
    for r in ops:
        top.add_row(
            r["op"], f"{r['calls']:,}", f"{r['self_cpu_ms']:.2f}", f"{r['self_cuda_ms']:.2f}", f"{r['share']:.1%}"
        )
    return top


@app.command("compile-report")
def compile_report(
    spec: Annotated[Path, typer.Argument(help="Benchmark spec YAML.")] = DEFAULT_SPEC,
    repeats: Annotated[
        int,
        typer.Option(
            help="Interleaved rounds (each runs every variant); 6 is the fewest with a 95% interval of each median."
        ),
    ] = 6,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Spec override, as for run.")] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks.")] = False,
) -> None:
    """Eager vs compiled encoders/pools, each in fresh processes, cold and warm Inductor cache."""
    from tasks.spec import load_spec

    tracker = None
    try:
        s = load_spec(spec, list(set_ or []))  # before the heavy imports: a bad spec exits in a second
        from flows.sweeps.compile_report import SLOWER_TAG, collect, slower_than_eager, summarize, to_markdown
        from tasks.measure import keys as K
        from tasks.tracking.writer import Tracker

        install_interrupts()  # SIGTERM: the parent run ends KILLED, exit 130, as run's
        tracker = Tracker(s.name)
        parent = tracker.start(
            f"{s.name}-compile-report", {"relflow.spec_hash": s.spec_hash, "relflow.report": "compile"}
        )
        console.print(f"parent MLflow run {parent} in experiment '{s.name}'")
        samples = collect(
            spec.resolve(),
            list(set_ or []),
            repeats,
            parent,
            on_sample=lambda x: console.print(
                f"  round {x.round + 1} {x.variant:<15} {x.cache:<5} steady "
                f"{x.metrics[K.STEADY_ROWS_PER_S]:,.0f} rows/s, first call "
                f"{x.metrics[K.FIRST_CALL_SECONDS]:.2f} s (run {x.run_id})"
            ),
        )
        rows = summarize(samples)
        md = to_markdown(rows)
        if slower := slower_than_eager(rows):
            tracker.set_tags({SLOWER_TAG: "; ".join(slower)})
        tracker.log_dict(rows, "compile_report.json")
        tracker.log_text(md, "compile_report.md")
        tracker.finish()
    except (Exception, KeyboardInterrupt) as err:
        if tracker is not None:
            tracker.fail(err)
        handle_run_error(err, debug, "the report's parent MLflow run was ended KILLED.")
    out.print(md)


@app.command("peak")
def peak_cmd(
    device: Annotated[str, typer.Option(help="Device to measure (auto = cuda if available).")] = "auto",
    precision: Annotated[str, typer.Option(help="fp32 | bf16 | fp16.")] = "fp32",
    remeasure: Annotated[bool, typer.Option(help="Measure again and replace the cached value.")] = False,
) -> None:
    """The host's peak matmul FLOP/s (the MFU denominator), cached per host fingerprint."""
    install_interrupts("the peak was not cached and no temporary file was left.")  # as run's: exit 130
    import torch

    from tasks.measure.environment import fingerprint
    from tasks.measure.hostload import BUSY_HOST_FRACTION
    from tasks.run.peak_flops import DTYPES, cache_file, peak_flops
    from tasks.runtime.errors import UserError

    if precision not in DTYPES:
        fail(UserError(f"--precision '{precision}' is not one of {sorted(DTYPES)}."), False)
    dev = torch.device(
        "cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device)
    )
    fp = fingerprint(dev)["relflow.host_fingerprint"]
    pk = peak_flops(fp, dev, precision, remeasure=remeasure)
    how = "cached" if pk.cached else "measured now"
    if not pk.cached and pk.other_cpu_fraction > BUSY_HOST_FRACTION:
        how += f", NOT cached: other processes used {pk.other_cpu_fraction:.0%} of the cores"
    out.print(
        f"peak {pk.flops_per_s / 1e9:,.1f} GFLOP/s ({precision}, {pk.device}, {pk.threads} threads, "
        f"{pk.size}^3 matmul, {how}; host {fp}; cache {cache_file()})"
    )


@data_app.command("tpch")
def data_tpch(
    scale: Annotated[float, typer.Option(help="TPC-H scale factor (1 = about 1 GB of CSV-equivalent).")] = 0.01,
    into: Annotated[
        str | None,
        typer.Option(
            help="Also load the tables into a database, key columns indexed: 'duckdb' (a file next "
            "to the Parquet), 'duckdb:<path>' or 'postgresql://user@host:port/db' (password from "
            "PGPASSWORD)."
        ),
    ] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks.")] = False,
) -> None:
    """Write TPC-H Parquet with tpchgen-cli into $RELFLOW_DATA_DIR (default ./data), once, and
    the RelBench folder rel-tpch next to it (two forecast tasks over customers)."""
    from tasks.datasets.tpch import ensure_tpch

    install_interrupts("tpchgen-cli was stopped and the temporary data folder removed.")
    try:
        t0 = wall_clock()
        folder, generated = ensure_tpch(scale)
        verb = f"generated in {wall_clock() - t0:.1f} s" if generated else "already present"
        out.print(f"TPC-H scale {scale:g}: {folder} ({verb})")
        from tasks.datasets.relbench_tpch import ensure_rel_tpch, is_complete, rel_tpch_dir, summary

        t0, present = wall_clock(), is_complete(rel_tpch_dir(folder))
        rel = ensure_rel_tpch(folder)
        verb = "already present" if present else f"written in {wall_clock() - t0:.1f} s"
        out.print(f"RelBench folder (customer-churn, customer-value): {rel} ({verb})")
        for line in summary(rel):
            console.print(f"  {line}")
        if into is not None:
            from tasks.sources.databases import load_tpch

            shown, rows, seconds = load_tpch(scale, into)
            out.print(f"loaded into {shown} in {seconds:.1f} s: " + ", ".join(f"{t} {n:,}" for t, n in rows.items()))
    except Exception as err:  # noqa: BLE001
        fail(err, debug)


app.command("compare")(compare_cmd)
app.command("noise")(noise_cmd)
app.command("history")(history_cmd)
app.command("dashboard")(dashboard_cmd)
app.command("ui")(ui_cmd)
app.command("export")(export_cmd)
app.command("quantize")(quantize_cmd)
app.command("backends-report")(backends_report_cmd)
app.command("models-report")(models_report_cmd)
app.command("sweep")(sweep_cmd)
app.command("budget")(budget_cmd)
app.command("serve")(serve_cmd)
app.command("peak-qps")(peak_qps_cmd)
app.command("floors")(floors_cmd)
app.command("relbench-init")(relbench_init_cmd)


def main() -> None:
    from tasks.runtime import watchdog

    # Registered before torch, Prefect and MLflow are imported, so it runs after their exit
    # handlers: the objects left are frozen, and the interpreter's teardown skips collecting
    # them (4.2 s of a tiny run's wall time, in gc_collect_main, after the last handler).
    atexit.register(gc.freeze)
    watchdog.start()  # no child process outlives this one, SIGKILL included
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(INTERRUPTED_EXIT)


if __name__ == "__main__":
    main()
