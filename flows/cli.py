"""``relflow-bench``: the command line.

Bad input ends with a one-paragraph message and exit code 2 (no traceback unless
``--debug``); other failures exit 1. Prefect is imported only once a command needs it, so
``--help`` is instant and Prefect's log level can be set from ``--debug`` first.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from tasks.clock import wall_clock
from tasks.errors import UserError

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
DEFAULT_SPEC = BENCHMARKS / "tpch_orders.yaml"

app = typer.Typer(
    help="Benchmark relational (nested-schema) transformers over the complete workload: "
    "retrieve -> preprocess -> tensorize -> compute -> write, tracked in MLflow.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
data_app = typer.Typer(help="Generate benchmark data.", no_args_is_help=True)
app.add_typer(data_app, name="data")
console = Console(stderr=True)
out = Console()


def _on_sigterm(signum: int, frame: Any) -> None:
    # Unwind like Ctrl-C so the MLflow run ends KILLED and partial files are removed.
    raise SystemExit(128 + signum)


def _fail(err: BaseException, debug: bool) -> None:
    if debug:
        raise err
    if isinstance(err, UserError):
        console.print(f"[bold red]error:[/] {err}")
        raise typer.Exit(UserError.exit_code)
    console.print(f"[bold red]failed:[/] {type(err).__name__}: {err}\n(rerun with --debug for "
                  "the traceback)")
    raise typer.Exit(1)


class _HideUserErrors(logging.Filter):
    """Prefect's engines log a task's exception with its traceback; for bad input the CLI's
    one-paragraph message is the whole story, so those records are dropped (not with --debug)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, UserError) and "UserError" not in record.getMessage()


def _start_run_command(debug: bool, set_: list[str] | None, scale: float | None) -> list[str]:
    """Shared start of the run-like commands: quiet logs, SIGTERM unwinds, the overrides."""
    _quiet_prefect(debug)
    signal.signal(signal.SIGTERM, _on_sigterm)
    overrides = list(set_ or [])
    if scale is not None:
        overrides.append(f"source.generate.tpch.scale={scale}")
    return overrides


def _handle_run_error(err: BaseException, debug: bool, interrupted: str) -> None:
    """Shared ending of the run-like commands: exits 130 on interrupts, else as ``_fail``."""
    if isinstance(err, typer.Exit):
        raise err
    if isinstance(err, KeyboardInterrupt | SystemExit) and not debug:
        console.print(f"[bold red]interrupted[/]: {interrupted}")
        raise typer.Exit(130) from None
    _fail(err, debug)


def _quiet_prefect(debug: bool) -> None:
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO" if debug else "WARNING")



def _hide_user_error_logs() -> None:
    """Filter Prefect's loggers and handlers, and keep MLflow's INFO lines (migrations, system
    metrics) out of the display; call after both configured their logging on import."""
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    hide = _HideUserErrors()
    names = [n for n in logging.root.manager.loggerDict if n.startswith("prefect")]
    for logger in [logging.getLogger(n) for n in names] + [logging.getLogger()]:
        logger.addFilter(hide)
        for handler in logger.handlers:
            handler.addFilter(hide)


@app.command()
def run(
    spec: Annotated[Path, typer.Argument(
        help="Benchmark spec YAML (default: the TPC-H orders workload).")] = DEFAULT_SPEC,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a spec key, e.g. --set run.batch_size=512 or "
        "--set lineitem.max_length=2 (branches by name). Repeatable; validated like the file.")] = None,
    scale: Annotated[float | None, typer.Option(
        help="TPC-H scale factor for generated data (same as --set source.generate.tpch.scale=S).")] = None,
    strict: Annotated[bool, typer.Option(
        help="Exit 3 when the run is INVALID (too little steady state, recompiles, quality floor).")] = False,
    parent_run: Annotated[str | None, typer.Option(
        help="Record this run as a child of an existing MLflow run id (sweeps, reports).")] = None,
    tag: Annotated[list[str] | None, typer.Option(
        help="Extra MLflow tag key=value on the run. Repeatable.")] = None,
    json_out: Annotated[Path | None, typer.Option(
        "--json", help="Also write the run summary (metrics, stages, paths) to this JSON file.")] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks and Prefect's logs.")] = False,
) -> None:
    """Run one benchmark: five timed stages as a Prefect flow, recorded as one MLflow run."""
    from tasks.spec import load_spec

    overrides = _start_run_command(debug, set_, scale)
    try:
        extra_tags = _pairs(tag or [], "--tag")
        s = load_spec(spec, overrides)
        from flows.benchmark import benchmark, plan
        from tasks import progress

        if not debug:
            _hide_user_error_logs()

        # Every input check (and data generation) before Prefect starts: bad input fails in
        # a second, not after the server's start-up. The flow repeats the cheap checks.
        checked = plan(s, spec.resolve().parent)
        if checked.generated:
            console.print(f"generated TPC-H data in {checked.data_seconds:.1f} s")
        launched = wall_clock()

        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                      console=console, transient=True) as bar:
            job = bar.add_task(f"{s.name}: starting Prefect", total=None)

            def show(event: str, info: dict[str, Any]) -> None:
                if event == "phase":
                    bar.update(job, description=f"{s.name}: {info['name']}")
                elif event == "stage":
                    extra = f" ({info['phase']})" if "phase" in info else ""
                    epoch = f" epoch {info['epoch'] + 1}" if "epoch" in info else ""
                    bar.update(job, description=f"{s.name}: chunk {info['chunk'] + 1}{epoch} "
                               f"{info['name']}{extra}")

            unsubscribe = progress.subscribe(show)
            try:
                summary = benchmark(spec=s.to_dict(), spec_dir=str(spec.resolve().parent),
                                    launched_at=launched, parent_run_id=parent_run, tags=extra_tags)
            finally:
                unsubscribe()
    except (Exception, KeyboardInterrupt, SystemExit) as err:
        _handle_run_error(err, debug, "the MLflow run was ended KILLED and partial outputs were removed.")
        return
    report(summary)
    if json_out is not None:
        json_out.write_text(json.dumps(summary, indent=2, default=str))
    if summary["validity"] == "INVALID" and strict:
        raise typer.Exit(3)


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"{flag} '{item}' must look like key=value.")
        k, v = item.split("=", 1)
        out[k.strip()] = v
    return out


def report(summary: dict[str, Any]) -> None:
    m = summary["metrics"]
    table = Table(title="Stages", title_justify="left")
    for col in ("stage", "seconds", "root rows", "rows/s", "share of e2e"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for row in summary["stages"]:
        table.add_row(row["stage"], f"{row['seconds']:.3f}", f"{row['rows']:,}",
                      f"{row['rows_per_s']:,.0f}", f"{row['share']:.1%}")
    table.add_row("[bold]end-to-end", f"[bold]{m['e2e.seconds']:.3f}",
                  f"{int(m['data.rows_predicted']):,}", f"[bold]{m['e2e.rows_per_s']:,.0f}", "100%")
    out.print(table)
    q = summary["quality_metric"]
    lines = [
        f"compute first call   {m['compute.first_call_seconds'] * 1e3:,.1f} ms "
        f"(steady batch p50 {m['compute.batch_ms.p50']:.1f} ms)",
        f"compute steady       {m['compute.steady_rows_per_s']:,.0f} rows/s (predict)"
        + (f", {m['compute.train.steady_rows_per_s']:,.0f} rows/s (train)"
           if "compute.train.steady_rows_per_s" in m else ""),
        f"data                 occupancy {m['data.occupancy']:.1%} "
        f"({int(m['data.coords_present']):,} of {int(m['data.coords_reserved']):,} coordinates), "
        f"{int(m['data.overflow_dropped']):,} rows dropped by overflow",
    ]
    if f"quality.{q}" in m:
        base = m.get("quality.majority_rate")
        note = f" (majority class {base:.3f})" if base is not None else ""
        if not summary["quality_meaningful"]:
            note += " [untrained weights: not meaningful, speed run]"
        lines.append(f"quality              {q} {m[f'quality.{q}']:.4f}{note}")
    lines += [
        f"memory               host peak {m['memory.host_peak_bytes'] / 2**20:,.0f} MiB",
        f"predictions          {summary['output_path']} ({int(m['output.bytes']):,} bytes)",
    ]
    if summary.get("checkpoint_path"):
        lines.append(f"checkpoint           {summary['checkpoint_path']}")
    lines += [
        f"harness start-up     {m['harness.startup_seconds']:.1f} s (not in e2e)",
        ("validity             VALID" if summary["validity"] == "VALID" else
         "validity             [bold red]INVALID[/]: " + "; ".join(summary["invalid_reasons"])),
        f"MLflow               experiment '{summary['experiment']}', run {summary['run_id']}",
        f"                     {summary['tracking_uri']}",
    ]
    out.print("\n".join(lines))


@app.command("compile-report")
def compile_report(
    spec: Annotated[Path, typer.Argument(help="Benchmark spec YAML.")] = DEFAULT_SPEC,
    repeats: Annotated[int, typer.Option(help="Interleaved rounds (each runs every variant).")] = 2,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Spec override, as for run.")] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks.")] = False,
) -> None:
    """Eager vs compiled encoders/pools, each in fresh processes, cold and warm Inductor cache."""
    from flows.compile_report import collect, summarize, to_markdown
    from tasks.spec import load_spec
    from tasks.tracking import Tracker

    tracker = None
    try:
        s = load_spec(spec, list(set_ or []))
        tracker = Tracker(s.name)
        parent = tracker.start(f"{s.name}-compile-report", {"relflow.spec_hash": s.spec_hash,
                                                             "relflow.report": "compile"})
        console.print(f"parent MLflow run {parent} in experiment '{s.name}'")
        samples = collect(spec.resolve(), list(set_ or []), repeats, parent, on_sample=lambda x: console.print(
            f"  round {x.round + 1} {x.variant:<15} {x.cache:<5} steady "
            f"{x.metrics['compute.steady_rows_per_s']:,.0f} rows/s, first call "
            f"{x.metrics['compute.first_call_seconds']:.2f} s (run {x.run_id})"))
        rows = summarize(samples)
        md = to_markdown(rows)
        tracker.log_dict(rows, "compile_report.json")
        tracker.log_text(md, "compile_report.md")
        tracker.finish()
    except (Exception, KeyboardInterrupt) as err:
        if tracker is not None:
            tracker.fail(err)
        _fail(err, debug)
        return
    out.print(md)


@data_app.command("tpch")
def data_tpch(
    scale: Annotated[float, typer.Option(help="TPC-H scale factor (1 = about 1 GB of CSV-equivalent).")] = 0.01,
    debug: Annotated[bool, typer.Option(help="Show tracebacks.")] = False,
) -> None:
    """Write TPC-H Parquet with tpchgen-cli into $RELFLOW_DATA_DIR (default ./data), once."""
    from tasks.data import ensure_tpch

    try:
        t0 = wall_clock()
        folder, generated = ensure_tpch(scale)
    except Exception as err:  # noqa: BLE001
        _fail(err, debug)
        return
    verb = f"generated in {wall_clock() - t0:.1f} s" if generated else "already present"
    out.print(f"TPC-H scale {scale:g}: {folder} ({verb})")


from flows.cli_reports import compare_cmd, dashboard_cmd, history_cmd, ui_cmd  # noqa: E402

app.command("compare")(compare_cmd)
app.command("history")(history_cmd)
app.command("dashboard")(dashboard_cmd)
app.command("ui")(ui_cmd)


from flows.cli_backends import backends_report_cmd, export_cmd, quantize_cmd  # noqa: E402
from flows.cli_fleet import serve_cmd, sweep_cmd  # noqa: E402

app.command("export")(export_cmd)
app.command("quantize")(quantize_cmd)
app.command("backends-report")(backends_report_cmd)

app.command("sweep")(sweep_cmd)
app.command("serve")(serve_cmd)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
