"""``relflow-bench floors``: the floor ledger of a spec's data on this host (tasks/run/floors.py).

Measured once per host fingerprint and data, cached like ``peak``; ``--remeasure`` refreshes
it. A ledger measured while other processes held more than 10% of the cores is shown and not
cached.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from flows.cli.common import DEFAULT_SPEC, console, fail, out, show_table, start_run_command

UNITS = {"retrieve": "MB/s", "tensorize": "MB/s", "compute": "GFLOP/s", "write": "MB/s", "orchestration": "calls/s"}
SCALE = {"retrieve": 1e6, "tensorize": 1e6, "compute": 1e9, "write": 1e6, "orchestration": 1.0}


def floors_cmd(
    spec: Annotated[
        Path, typer.Argument(help="Benchmark spec YAML (default: the TPC-H orders workload).")
    ] = DEFAULT_SPEC,
    remeasure: Annotated[bool, typer.Option(help="Measure again and replace the cached ledger.")] = False,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Spec override, as for run.")] = None,
    scale: Annotated[float | None, typer.Option(help="TPC-H scale factor (as for run).")] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks.")] = False,
) -> None:
    """Each stage's floor on this host for the spec's data, cached per host fingerprint."""
    overrides = start_run_command(debug, set_, scale)
    try:
        from tasks.spec import load_spec

        s = load_spec(spec, overrides)  # before torch, Prefect and MLflow (10+ s): a bad spec exits in a second
        from flows.floors import orchestration_floor
        from tasks.measure.environment import fingerprint
        from tasks.measure.hostload import BUSY_HOST_FRACTION
        from tasks.run.checks.plan import plan
        from tasks.run.floors import ledger

        checked = plan(s, spec.resolve().parent)
        if checked.generated:
            console.print(f"generated TPC-H data in {checked.data_seconds:.1f} s")
        host = fingerprint(checked.device)["relflow.host_fingerprint"]
        led = ledger(
            s, checked.sources, checked.device, host, orchestration_floor, remeasure=remeasure, library=checked.library
        )
    except (Exception, KeyboardInterrupt) as err:
        fail(err, debug)
    table = Table(title=f"Floors of '{s.name}' on this host", title_justify="left")
    for col in ("stage", "floor", "unit", "measured on", "best seconds", "how"):
        table.add_column(col, justify="left" if col in ("stage", "unit", "how") else "right")
    for name, f in led.floors.items():
        table.add_row(name, f"{f.rate / SCALE[name]:,.1f}", UNITS[name], f"{f.amount:,.0f}", f"{f.seconds:.5f}", f.how)
    show_table(table)
    how = "cached" if led.cached else "measured now"
    if not led.cached and led.other_cpu_fraction > BUSY_HOST_FRACTION:
        how += f", NOT cached: other processes used {led.other_cpu_fraction:.0%} of the cores"
    from tasks.run.floors import cache_file

    out.print(f"ledger {how}; host {host}; key {led.key}; cache {cache_file()}")
