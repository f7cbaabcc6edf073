"""``relflow-bench serve``: Prefect deployments of the benchmark flow, one per spec, for a fleet.

Registered on the main Typer app in ``flows/cli/app.py``; exit codes as every command's (see
``flows/cli/common.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from flows.cli.common import BENCHMARKS, console, fail, out, quiet_prefect, show_table
from tasks.runtime.masking import mask_uri


def serve_cmd(
    specs: Annotated[
        list[Path] | None, typer.Argument(help="Spec YAML files to deploy (default: every benchmarks/*.yaml).")
    ] = None,
    pool: Annotated[
        str | None,
        typer.Option(help="Process work pool, one per hardware class (default: relflow-cpu or relflow-cuda)."),
    ] = None,
    cron: Annotated[
        str | None,
        typer.Option(help="Cron schedule for every deployment (default: each spec's schedule.cron; none = on demand)."),
    ] = None,
    timezone: Annotated[str | None, typer.Option(help="Time zone of the cron expression (default UTC).")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a spec key in every deployed spec, as for run.")
    ] = None,
    working_dir: Annotated[
        Path | None,
        typer.Option(help="Working directory of the flow runs on the worker's host (default: this folder)."),
    ] = None,
    create_pool: Annotated[bool, typer.Option(help="Create the process work pool if it does not exist.")] = False,
    debug: Annotated[bool, typer.Option(help="Show tracebacks and Prefect's logs.")] = False,
) -> None:
    """Create or update Prefect deployments of the benchmark flow (needs `prefect server start`)."""
    from flows.schedules import default_pool, deploy, ensure_pool, plan_deployments, require_server
    from tasks.spec.sections import load_spec_and_sections

    quiet_prefect(debug)
    try:
        paths = list(specs or sorted(BENCHMARKS.glob("*.yaml")))
        for path in paths:  # before torch (the default pool), Prefect and MLflow: a bad spec exits in a second
            load_spec_and_sections(path, list(set_ or []))
        pool = pool or default_pool()
        planned = plan_deployments(paths, pool, list(set_ or []), cron, timezone)
        url = require_server()
        created = ensure_pool(pool, create_pool)
        ids = deploy(planned, pool, (working_dir or Path.cwd()).resolve())
    except (Exception, KeyboardInterrupt) as err:
        fail(err, debug)
    if created:
        console.print(f"created process work pool '{pool}'")
    table = Table(title=f"Deployments on {url} (work pool '{pool}')", title_justify="left")
    for col in ("deployment", "schedule", "spec", "id"):
        table.add_column(col)
    for p, i in zip(planned, ids, strict=True):
        table.add_row(f"benchmark/{p.name}", f"{p.cron} ({p.timezone})" if p.cron else "on demand", str(p.path), i)
    show_table(table)
    from tasks.tracking.uri import tracking_uri

    out.print(
        f"runs are recorded in {mask_uri(tracking_uri())}\nstart a worker:  prefect worker start --pool "
        f"'{pool}'\nrun one now:     prefect deployment run 'benchmark/{planned[0].name}'"
    )
