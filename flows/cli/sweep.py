"""``relflow-bench sweep``: a grid of configurations, one parent MLflow run, one child each.

Registered on the main Typer app in ``flows/cli/app.py``; exit codes as every command's (see
``flows/cli/common.py``), plus 1 when any configuration of the sweep failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from flows.cli.common import console, handle_run_error, out, pairs, show_table, start_run_command
from tasks.runtime.errors import UserError
from tasks.spec.parse import load_yaml


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """``--grid run.batch_size=64,256`` -> ``{"run.batch_size": [64, 256]}`` (values read as YAML)."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip() or not text.strip():
            raise UserError(f"--grid '{item}' must look like key.path=v1,v2,... e.g. --grid run.batch_size=64,256,1024")
        grid[key.strip()] = [load_yaml(v.strip(), f"--grid {key.strip()}") for v in text.split(",")]
    return grid


def _fmt(x: float | None, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def sweep_table(summary: dict[str, Any]) -> Table:
    table = Table(title=f"Sweep {summary['sweep_hash']} (parent run {summary['parent_run_id']})", title_justify="left")
    metric = next((r["quality_metric"] for r in summary["rows"] if r["quality_metric"]), "")
    pooled = any("worker" in r for r in summary["rows"])  # fanned out: show who ran each
    for col in (
        "#",
        "config",
        "status",
        "steady rows/s",
        "e2e predict rows/s",
        f"quality ({metric})",
        "validity",
        "run id",
        *(["worker"] if pooled else []),
    ):
        left = {"config", "status", "validity", "run id", "worker"}
        table.add_column(col, justify="left" if col in left else "right")
    for r in summary["rows"]:
        status = {"FAILED": "[bold red]FAILED[/]", "SKIPPED": "skipped (done)"}.get(r["status"], r["status"])
        quality = "-" if r["quality"] is None else f"{r['quality']:.4f}"
        table.add_row(
            str(r["index"] + 1),
            r["config"],
            status,
            _fmt(r["steady_rows_per_s"]),
            _fmt(r["e2e_rows_per_s"]),
            quality,
            r["validity"] or "-",
            r["run_id"] or "-",
            *([r.get("worker", "-")] if pooled else []),
        )
    return table


def sweep_cmd(
    spec: Annotated[Path, typer.Argument(help="Base benchmark spec YAML; may hold a 'sweep: {grid: ...}' section.")],
    grid: Annotated[
        list[str] | None,
        typer.Option(
            "--grid",
            help="Swept key and its values, e.g. --grid run.batch_size=64,256,1024 (values read "
            "as YAML; branches by name). Repeatable: the sweep is the Cartesian product. Adds to / "
            "replaces keys of the spec's sweep.grid.",
        ),
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a base spec key for every configuration, as for run.")
    ] = None,
    scale: Annotated[
        float | None, typer.Option(help="TPC-H scale factor (same as --set source.generate.tpch.scale=S).")
    ] = None,
    tag: Annotated[
        list[str] | None, typer.Option(help="Extra MLflow tag key=value on the parent and every child run. Repeatable.")
    ] = None,
    pool: Annotated[
        str | None,
        typer.Option(
            help="Fan configurations out to this Prefect work pool's workers (one flow run of the benchmark "
            "deployment each; needs `prefect server start`). Default: the spec's sweep.pool."
        ),
    ] = None,
    queue: Annotated[
        str | None,
        typer.Option(
            help="Work queue of --pool to pin the configurations to (a queue per host). Default: sweep.queue."
        ),
    ] = None,
    working_dir: Annotated[
        Path | None,
        typer.Option(
            help="With --pool: working directory of the flow runs on the workers' hosts (default: this folder)."
        ),
    ] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks and Prefect's logs.")] = False,
) -> None:
    """Run a grid of configurations, one at a time: one parent MLflow run, one child per config.

    Rerunning the same sweep (same base spec and grid) reuses its parent run and skips every
    configuration that already has a FINISHED child. Exits 1 if any configuration failed.
    """
    overrides = start_run_command(debug, set_, scale)
    try:
        summary = _run_sweep(spec, overrides, grid or [], pairs(tag or [], "--tag"), pool, queue, working_dir)
    except (Exception, KeyboardInterrupt, SystemExit) as err:
        handle_run_error(
            err,
            debug,
            "the running configuration and the parent run were ended KILLED; rerun the same command to resume.",
        )
    _print_sweep_summary(summary)
    if any(r["status"] == "FAILED" for r in summary["rows"]):
        raise typer.Exit(1)


def _run_sweep(
    path: Path,
    overrides: list[str],
    grid: list[str],
    tags: dict[str, str],
    pool: str | None = None,
    queue: str | None = None,
    working_dir: Path | None = None,
) -> dict[str, Any]:
    """Validate every configuration and make the data available before Prefect starts, then run
    the sweep flow (or, with a pool, fan it out to the pool's workers), printing one line per
    configuration; returns the flow's summary."""
    from tasks.runtime import progress
    from tasks.spec.sections import load_spec_and_sections

    base, sections = load_spec_and_sections(path, overrides)
    from tasks.run.checks.preflight import check_settings

    check_settings(base)  # tracking store, output folder, lock file: before the heavy imports
    full_grid = dict(sections.sweep.grid) if sections.sweep else {}
    full_grid.update(parse_grid(grid))
    from flows.sweeps.grid import expand, sweep
    from tasks.run.checks.plan import plan

    configs = expand(base, full_grid)  # every configuration validated before Prefect starts
    from flows.sweeps.pool import check_pool_args

    pool = pool or (sections.sweep.pool if sections.sweep else None)
    queue = queue or (sections.sweep.queue if sections.sweep else None)
    check_pool_args(pool, queue)
    checked = plan(base, path.resolve().parent)
    if checked.generated:
        console.print(f"generated TPC-H data in {checked.data_seconds:.1f} s")
    console.print(
        f"sweep of '{base.name}': {len(configs)} configurations over {', '.join(full_grid)}; starting Prefect"
    )
    unsubscribe = progress.subscribe(show_sweep_event)
    try:
        if pool:
            from flows.sweeps.pool import prepare, sweep_pool

            deployment = prepare(path, base.to_dict(), pool, (working_dir or Path.cwd()).resolve())
            console.print(
                f"fanning out to work pool '{pool}'"
                + (f", queue '{queue}'" if queue else "")
                + f" as flow runs of {deployment}"
            )
            return sweep_pool(
                base_spec=base.to_dict(),
                grid=full_grid,
                deployment=deployment,
                pool=pool,
                spec_dir=str(path.resolve().parent),
                queue=queue,
                tags=tags,
            )
        return sweep(base_spec=base.to_dict(), grid=full_grid, spec_dir=str(path.resolve().parent), tags=tags)
    finally:
        unsubscribe()


def show_sweep_event(event: str, info: dict[str, Any]) -> None:
    """One stderr line per sweep event: parent run, skipped / started / finished configuration."""
    if event != "sweep":
        return
    kind, n = info["kind"], info["total"]
    if kind == "parent":
        verb = "resuming sweep" if info["reused"] else "new sweep"
        console.print(f"{verb} {info['sweep_hash']}: parent MLflow run {info['run_id']}")
    elif kind == "skipped":
        r = info["row"]
        console.print(f"[{r.index + 1}/{n}] {r.config}: skipped, already FINISHED as run {r.run_id}")
    elif kind == "start":
        console.print(f"[{info['index'] + 1}/{n}] {info['config']}: running")
    elif kind == "done":
        r = info["row"]
        if r.status == "FAILED":
            console.print(f"[{r.index + 1}/{n}] {r.config}: [bold red]FAILED[/] (run {r.run_id}): {r.error}")
        else:
            console.print(f"[{r.index + 1}/{n}] {r.config}: FINISHED (run {r.run_id})")


def _print_sweep_summary(summary: dict[str, Any]) -> None:
    # A pipe or log file gets the full table (run ids included) instead of an 80-column squeeze.
    show_table(sweep_table(summary))
    rows = summary["rows"]
    skipped = sum(r["status"] == "SKIPPED" for r in rows)
    failed = sum(r["status"] == "FAILED" for r in rows)
    out.print(
        f"{len(rows) - skipped - failed} ran, {skipped} skipped (FINISHED before), "
        f"{failed} failed; MLflow experiment '{summary['experiment']}', parent run "
        f"{summary['parent_run_id']}\n{summary['tracking_uri']}"
    )
