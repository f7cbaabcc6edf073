"""``relflow-bench noise [SPEC] [--runs N] [--set ...]``: one configuration's noise floor."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flows.cli.common import DEFAULT_SPEC, console, handle_run_error, install_interrupts, out


def noise_cmd(
    spec: Annotated[Path, typer.Argument(help="Benchmark spec YAML.")] = DEFAULT_SPEC,
    runs: Annotated[
        int,
        typer.Option(
            help="Fresh-process runs of the configuration (at least 2 for a CV; compare's rank test needs 4+ "
            "a side, 6 for the ~10-20 metrics a run logs)."
        ),
    ] = 6,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Spec override, as for run.")] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks.")] = False,
) -> None:
    """Run one configuration N times in fresh processes: between-run CV and minimum detectable effect.

    Logs noise.<metric>.cv and noise.<metric>.mde on a parent MLflow run (each run is a child
    run): the MDE of compare's rank test between two groups of N runs, Holm over the metrics it
    tests, at 80% power; none, and "not enough runs", where N runs a side can mark nothing."""
    from flows.sweeps.noise import check_runs, collect, family, not_enough, summarize, to_markdown
    from tasks.measure import keys as K
    from tasks.measure.significance import run_sample
    from tasks.spec import load_spec

    tracker = None
    try:
        check_runs(runs)
        s = load_spec(spec, list(set_ or []))  # bad input: exit 2 before any run, and before MLflow loads
        from tasks.tracking.writer import Tracker

        install_interrupts()  # as run's: exit 130, the runs ended KILLED (the parent here, each run by its process)
        tracker = Tracker(s.name)
        parent = tracker.start(f"{s.name}-noise", {"relflow.spec_hash": s.spec_hash, "relflow.report": "noise"})
        console.print(f"parent MLflow run {parent} in experiment '{s.name}': {runs} fresh-process runs")

        def show(i: int, r) -> None:
            figures = ", ".join(f"{k} {v:,.0f}" for k in K.NOISE_METRICS if (v := run_sample(r.metrics, k)) is not None)
            console.print(f"  run {i + 1}/{runs}: {figures} (run {r.run_id})")

        reports = collect(s, spec.resolve().parent, runs, parent, tracker.uri, on_run=show)
        figures = summarize(reports)
        md = to_markdown(reports, figures)
        tracker.log_metrics(figures)
        tracker.log_text(md, "noise.md")
        tracker.finish()
    except (Exception, KeyboardInterrupt) as err:
        if tracker is not None:
            tracker.fail(err)
        handle_run_error(err, debug, "the noise report's parent MLflow run was ended KILLED.")
    out.print(md)
    for key in K.NOISE_METRICS:
        c, m = K.noise(key, "cv"), K.noise(key, "mde")
        if m in figures:
            out.print(f"{c} = {figures[c]:.4f}, {m} = {figures[m]:.4f}")
        elif c in figures:
            out.print(f"{c} = {figures[c]:.4f}, {m}: {not_enough(len(reports), family(reports))}")
