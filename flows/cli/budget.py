"""``relflow-bench budget``: quality against cost over a grid of context sizes (flows/sweeps/budget.py).

Registered on the main Typer app in ``flows/cli/app.py``; exit codes as every command's (see
``flows/cli/common.py``): 2 for a bad grid before any child runs, 1 when a point failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from flows.cli.common import console, handle_run_error, out, pairs, show_table, start_run_command
from flows.cli.sweep import parse_grid

if TYPE_CHECKING:
    from flows.sweeps.budget import BudgetResult


def budget_table(result: BudgetResult) -> Table:
    from flows.sweeps.budget import table_rows

    table = Table(
        title=f"Budget: {result.quality_key} against e2e ms per prediction (parent run {result.parent_run_id})",
        title_justify="left",
    )
    header, rows = table_rows(result.points)
    for col in header:
        table.add_column(
            col, justify="left" if col in {"point", "quality [95% CI]", "Pareto", "validity", "run"} else "right"
        )
    for r in rows:
        table.add_row(*[("[bold green]front[/]" if c == "front" else c) for c in r])
    return table


def budget_cmd(
    spec: Annotated[Path, typer.Argument(help="Benchmark spec YAML; may hold a 'sweep: {grid: ...}' section.")],
    grid: Annotated[
        list[str] | None,
        typer.Option(
            "--grid",
            help="A context-size key and its values: <branch>.max_length=4,8,16, <branch>.overflow=keep_first,"
            "keep_last, or model.rt.context.<key>=... Repeatable (Cartesian product). Default: RT's "
            "model.rt.context.max_context_cells=128..2048 when the spec has it, else each top-level branch's "
            "max_length at 1/4, 1/2 and 1 of its value.",
        ),
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a spec key for every point, as for run.")
    ] = None,
    scale: Annotated[
        float | None, typer.Option(help="TPC-H scale factor (--set source.generate.tpch.scale=S).")
    ] = None,
    tag: Annotated[list[str] | None, typer.Option(help="Extra MLflow tag key=value on every run. Repeatable.")] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Folder for budget.md/.json/.html/.png (default: <run.output_dir>/budget-<parent>)."
        ),
    ] = None,
    png: Annotated[bool, typer.Option("--png/--no-png", help="Draw budget.png (needs Chrome/Chromium).")] = True,
    debug: Annotated[bool, typer.Option(help="Show tracebacks and Prefect's logs.")] = False,
) -> None:
    """Quality against cost per context size: each point a fresh `relflow-bench run`, the Pareto
    front marked (overlapping quality intervals are not ranked), a table, a chart, one parent run.

    Rerunning the same budget resumes it, as a sweep does. Exits 1 if any point failed.
    """
    overrides = start_run_command(debug, set_, scale)
    try:
        result = _run(spec, overrides, grid or [], pairs(tag or [], "--tag"), out_dir, png)
    except (Exception, KeyboardInterrupt, SystemExit) as err:
        handle_run_error(
            err, debug, "the running point and the parent run were ended KILLED; rerun the same command to resume."
        )
    show_table(budget_table(result))
    for line in result.markdown.split("\n\n")[1:]:  # the notes under the table
        out.print(line)
    for f in result.files:
        out.print(str(f))
    if result.png_skipped:
        console.print(f"[yellow]{result.png_skipped}[/]")
    if any(p.status == "FAILED" for p in result.points):
        raise typer.Exit(1)


def _run(
    path: Path, overrides: list[str], grid: list[str], tags: dict[str, str], out_dir: Path | None, png: bool
) -> BudgetResult:
    """Every point validated (spec, context keys, the library's own check) before Prefect or any
    child starts; then the budget."""
    from tasks.spec.sections import load_spec_and_sections

    base, sections = load_spec_and_sections(path, overrides)
    from tasks.run.checks.preflight import check_settings

    check_settings(base)
    full_grid: dict[str, list[Any]] = dict(sections.sweep.grid) if sections.sweep else {}
    full_grid.update(parse_grid(grid))
    from flows.sweeps.budget import check_context_keys, default_grid

    if not full_grid:
        full_grid = default_grid(base)
    check_context_keys(full_grid)
    from flows.sweeps.grid import expand
    from tasks.libraries import check_library
    from tasks.runtime.errors import UserError
    from tasks.spec import parse_spec

    configs = expand(base, full_grid)
    for c in configs:
        try:
            check_library(parse_spec(c.spec, f"(budget point {c.label})"))
        except UserError as err:
            raise UserError(f"budget point {c.label}: {err}") from None
    from tasks.run.checks.plan import plan

    checked = plan(base, path.resolve().parent)
    if checked.generated:
        console.print(f"generated TPC-H data in {checked.data_seconds:.1f} s")
    console.print(
        f"budget of '{base.name}': {len(configs)} context sizes over {', '.join(full_grid)}; starting Prefect"
    )
    from flows.cli.sweep import show_sweep_event
    from flows.sweeps.budget import run_budget
    from tasks.runtime import progress

    unsubscribe = progress.subscribe(show_sweep_event)
    try:
        return run_budget(base.to_dict(), full_grid, str(path.resolve().parent), tags, out_dir, png, say=console.print)
    finally:
        unsubscribe()
