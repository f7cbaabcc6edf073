"""``relflow-bench peak-qps``: the highest Poisson rate at which a server run is VALID at a
latency bound (LoadGen's server rule, p99).

Registered on the main Typer app in ``flows/cli/app.py``; the flow is ``flows/sweeps/peak.py``,
the search ``tasks/run/scenarios/peak.py``. Exit codes as every command's (``flows/cli/common.py``),
plus 1 when the search found no peak: no probed rate passed, or every one did (a lower bound
only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from flows.cli.common import DEFAULT_SPEC, console, handle_run_error, out, pairs, show_table, start_run_command


def peak_table(summary: dict[str, Any]) -> Table:
    table = Table(
        title=f"peak-qps, bound {summary['bound_ms']:g} ms (parent run {summary['parent_run_id']}), probes by rate",
        title_justify="left",
    )
    for col in ("#", "target QPS", "achieved QPS", "p99 server rule (ms)", "passed", "validity", "run id"):
        table.add_column(col, justify="left" if col in {"passed", "validity", "run id"} else "right")
    order = sorted(range(len(summary["probes"])), key=lambda i: summary["probes"][i]["rate"])
    for i in order:
        p = summary["probes"][i]
        p99 = p["p99_server_rule_ms"]
        table.add_row(
            str(i + 1),
            f"{p['rate']:.2f}",
            "-" if p["achieved_qps"] is None else f"{p['achieved_qps']:.2f}",
            "n/a" if p99 is None else f"{p99:.2f}",
            "yes" if p["passed"] else "[bold red]no[/]",
            p["validity"] or "-",
            p["run_id"] or "-",
        )
    return table


def _show(event: str, info: dict[str, Any]) -> None:
    if event != "peak":
        return
    kind = info["kind"]
    if kind == "parent":
        console.print(f"peak-qps: parent MLflow run {info['run_id']}")
    elif kind == "train":
        console.print("training once (an offline child run); every probe serves its checkpoint")
    elif kind == "trained":
        console.print(f"trained: run {info['run_id']}, checkpoint {info['checkpoint']}")
    elif kind == "start":
        # markup off: rich read "[probe 1]" as a style tag and dropped it (and reasons may hold brackets)
        console.print(f"[probe {info['index'] + 1}] {info['rate']:.2f} QPS: running", markup=False)
    elif kind == "done":
        p = info["probe"]
        p99 = "n/a" if p.p99_ms is None else f"{p.p99_ms:.2f} ms"
        verdict = "passed (VALID)" if p.passed else f"failed ({p.validity}: {'; '.join(p.reasons) or '-'})"
        console.print(
            f"[probe {info['index'] + 1}] {p.rate:.2f} QPS: p99 server rule {p99}, {verdict} (run {p.run_id})",
            markup=False,
        )


def peak_qps_cmd(
    spec: Annotated[Path, typer.Argument(help="Benchmark spec YAML.")] = DEFAULT_SPEC,
    bound_ms: Annotated[
        float, typer.Option("--bound-ms", help="Latency bound (ms) of LoadGen's server rule (p99) for every probe.")
    ] = 0.0,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Spec override for every probe, as for run.")] = None,
    scale: Annotated[float | None, typer.Option(help="TPC-H scale factor.")] = None,
    start_qps: Annotated[
        float | None, typer.Option(help="First probe's rate (default: the spec's run.request.target_qps).")
    ] = None,
    probe_requests: Annotated[
        int,
        typer.Option(
            help="Each probe's run.request.min_requests (662: LoadGen's server rule tolerates one request over "
            "the bound; 459 at least)."
        ),
    ] = 662,
    probe_seconds: Annotated[
        float, typer.Option(help="Each probe's run.request.min_duration_s (LoadGen's own: 600).")
    ] = 10.0,
    tolerance: Annotated[float, typer.Option(help="Stop when the bracket's high / low <= 1 + this.")] = 0.05,
    max_probes: Annotated[int, typer.Option(help="Give up after this many probes.")] = 16,
    tag: Annotated[list[str] | None, typer.Option(help="Extra MLflow tag key=value (repeatable).")] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks and Prefect's logs.")] = False,
) -> None:
    """Search the server scenario's Poisson rate for the highest one whose run is VALID at
    --bound-ms (LoadGen's server rule, p99, and every other validity rule), each probe a
    fresh-process server run (child of one parent run). Exits 1 when the search found no peak:
    no probed rate passed, or every one did."""
    overrides = start_run_command(debug, set_, scale)
    try:
        summary = _run(spec, overrides, bound_ms, start_qps, probe_requests, probe_seconds, tolerance, max_probes, tag)
    except (Exception, KeyboardInterrupt, SystemExit) as err:
        handle_run_error(err, debug, "the running probe and the parent run were ended KILLED.")
    show_table(peak_table(summary))
    low, high = summary["bracket"]
    otherwise = sorted(p["rate"] for p in summary["probes"] if not p["passed"] and not p["missed_bound"])
    if otherwise:
        out.print(
            "failed for a reason other than the bound (INVALID with the p99 within it, or the run failed; "
            f"the reasons above): {', '.join(f'{r:.2f}' for r in otherwise)} QPS; the search stays below these "
            "rates, but none is an upper bound on the peak"
        )
    if low is None:
        if high is None:
            out.print(f"no probed rate passed at {summary['bound_ms']:g} ms, and none missed the bound")
        else:
            out.print(f"no probed rate passed at {summary['bound_ms']:g} ms; lowest rate over the bound {high:.2f}")
        if summary.get("unloaded_above_bound"):
            out.print(
                "halving the rate no longer lowered the p99, so the latency at low load is above the "
                "bound: lower rates would fail the same (raise --bound-ms, or make one request faster)"
            )
        if summary.get("failed_otherwise"):
            out.print(
                "the last two probes failed for reasons other than the bound: a lower rate would not cure "
                "them, so halving stopped; remove the cause (the reasons above) and run again"
            )
        raise typer.Exit(1)
    if high is None:
        what = "every probe passed" if not otherwise else "no probe missed the bound"
        out.print(
            f"no peak found: {what}, up to {low:.2f} QPS (server.peak_qps_bracket_low, a lower "
            f"bound on the peak; server.peak_qps not logged); raise --max-probes or --start-qps\n"
            f"parent run {summary['parent_run_id']}, {summary['tracking_uri']}"
        )
        raise typer.Exit(1)
    out.print(
        f"server.peak_qps {low:.2f} QPS (bracket {low:.2f} .. {high:.2f}); chart peak_qps.html on parent run "
        f"{summary['parent_run_id']}\n{summary['tracking_uri']}"
    )


def _run(
    path: Path,
    overrides: list[str],
    bound_ms: float,
    start_qps: float | None,
    probe_requests: int,
    probe_seconds: float,
    tolerance: float,
    max_probes: int,
    tag: list[str] | None,
) -> dict[str, Any]:
    """Validate the spec and flags and make the data before Prefect starts, then the flow."""
    from tasks.run.scenarios.peak import check_args
    from tasks.spec import load_spec

    check_args(bound_ms, probe_requests, probe_seconds, tolerance)  # before the heavy imports
    base = load_spec(path, overrides)
    from flows.sweeps.peak import peak_qps
    from tasks.run.checks.plan import plan

    checked = plan(base, path.resolve().parent)
    if checked.generated:
        console.print(f"generated TPC-H data in {checked.data_seconds:.1f} s")
    from tasks.runtime import progress

    unsubscribe = progress.subscribe(_show)
    try:
        return peak_qps(
            base_spec=base.to_dict(),
            bound_ms=bound_ms,
            spec_dir=str(path.resolve().parent),
            probe_requests=probe_requests,
            probe_seconds=probe_seconds,
            start_qps=start_qps,
            tolerance=tolerance,
            max_probes=max_probes,
            tags=pairs(tag or [], "--tag"),
        )
    finally:
        unsubscribe()
