"""Report commands: ``compare``, ``history``, ``dashboard`` and ``ui``.

They read the MLflow store that ``relflow-bench run`` writes (``MLFLOW_TRACKING_URI`` or
``sqlite:///<cwd>/mlflow.db``) through ``tasks.tracking.reader``; the logic lives in
``dashboards/`` as pure functions over run records. Registered on the app in
``flows/cli/app.py``. Exit codes as every command's (``flows/cli/common.py``), plus 4 when
``history --fail-on-regression`` finds a regression.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from flows.cli.common import console, fail, install_interrupts, out, show_table
from tasks.runtime.errors import UserError
from tasks.runtime.masking import mask_uri

if TYPE_CHECKING:
    from dashboards.compare import Comparison

REGRESSION_EXIT = 4


# --- compare ------------------------------------------------------------------------


def _cell(est, key: str) -> str:
    from dashboards.compare import fmt_value

    text = fmt_value(key, est.value)
    if est.has_interval:
        text += f"\n[dim][{fmt_value(key, est.low)}, {fmt_value(key, est.high)}]"
        text += f" n={est.n_runs} runs[/]" if est.n_runs > 1 else "[/]"
    return text


def print_comparison(c) -> None:
    from dashboards.compare import BELOW_MDE

    table = Table(
        title=f"{c.baseline_label}  vs  {c.candidate_label}   ({c.baseline_independent_runs} vs "
        f"{c.candidate_independent_runs} independent runs; marked: beyond {c.threshold:.0%}, significant at "
        f"{c.alpha:g} across runs after Holm; below the MDE: flagged)",
        title_justify="left",
        show_lines=False,
    )
    for col, just in (
        ("metric", "left"),
        ("baseline", "right"),
        ("candidate", "right"),
        ("ratio", "right"),
        ("MDE", "right"),
        ("test", "left"),
        ("verdict", "left"),
    ):
        table.add_column(col, justify=just)
    for r in c.rows:
        ratio = "inf" if math.isinf(r.ratio) else f"{r.ratio:.3f}x"
        test = r.method + (f" p={r.p_value:.3f} holm={r.p_holm:.3f}" if r.p_value is not None else "")
        style = {"regression": "bold red", "improvement": "bold green", "change": "bold yellow"}.get(r.verdict)
        mark = {"regression": "▼ ", "improvement": "▲ ", "change": "● "}.get(r.verdict, "") if r.marked else ""
        verdict = f"[{style}]{mark}{r.verdict}[/]" if r.marked and style else f"[dim]{r.verdict}[/]"
        if r.below_mde:
            verdict += f" [yellow]({BELOW_MDE})[/]"
        floor = f"{r.mde:.1%}" if math.isfinite(r.mde) else "-"
        table.add_row(r.key, _cell(r.baseline, r.key), _cell(r.candidate, r.key), ratio, floor, test, verdict)
    show_table(table)
    for title, diffs in (
        ("spec params that differ", c.param_differences),
        ("environment tags that differ", c.tag_differences),
    ):
        if diffs:
            t = Table(title=title, title_justify="left")
            for col in ("key", "baseline", "candidate"):
                t.add_column(col)
            for d in diffs:
                t.add_row(d.key, d.baseline, d.candidate)
            show_table(t)
        else:
            out.print(f"{title}: none")
    for note in c.notes:
        out.print(f"[yellow]note:[/] {note}")
    n = len(c.marked)
    out.print(f"{n} marked change(s)" + (": " + ", ".join(f"{r.key} {r.verdict}" for r in c.marked) if n else ""))


def side_runs(run_id: str):
    """One side of ``compare RUN_A RUN_B``: the run itself, or, for a parent run (``relflow-bench
    noise``, a sweep), its FINISHED benchmark children: independent fresh-process runs."""
    from dashboards.history import profiled
    from tasks.measure.keys import E2E_PREDICT_ROWS_PER_S
    from tasks.tracking.reader import get_stored_run, search_runs

    run = get_stored_run(run_id)
    if E2E_PREDICT_ROWS_PER_S in run.metrics:
        return run, [run]
    children = [
        r
        for r in search_runs(run.experiment, filter_string=f"tags.mlflow.parentRunId = '{run.run_id}'")
        if E2E_PREDICT_ROWS_PER_S in r.metrics and not profiled(r)
    ]
    if not children:
        raise UserError(
            f"run {run_id} has no benchmark figures and no FINISHED benchmark child runs: give a benchmark run "
            "or the parent run of relflow-bench noise"
        )
    return run, children


def compare_by_key(
    experiment: str, baseline: str, candidate: str | None, include_profiled: bool, threshold: float, alpha: float
) -> Comparison:
    """``compare --experiment E --baseline KEY=VALUE [--candidate V]``: the experiment's benchmark
    runs split into two groups by one tag or param."""
    from dashboards.compare import compare, split_by
    from dashboards.history import profiled
    from tasks.measure.keys import E2E_PREDICT_ROWS_PER_S
    from tasks.tracking.reader import search_runs

    if "=" not in baseline:
        raise UserError(f"--baseline '{baseline}' must look like KEY=VALUE, e.g. relflow.git_sha=abc123.")
    key, value = baseline.split("=", 1)
    pool = [
        r
        for r in search_runs(experiment)
        if E2E_PREDICT_ROWS_PER_S in r.metrics and (include_profiled or not profiled(r))
    ]
    if not pool:
        raise UserError(f"experiment '{experiment}' has no FINISHED benchmark runs.")
    base, cand, cand_value = split_by(pool, key, value, candidate)
    if not base or not cand:
        raise UserError(
            f"{key}: {len(base)} baseline run(s) with '{value}' and {len(cand)} candidate "
            f"run(s) with '{cand_value}' in '{experiment}': need at least one each."
        )
    return compare(
        base,
        cand,
        threshold=threshold,
        alpha=alpha,
        baseline_label=f"{key}={value} ({len(base)} runs)",
        candidate_label=f"{key}={cand_value} ({len(cand)} runs)",
    )


def compare_run_ids(run_a: str, run_b: str, threshold: float, alpha: float) -> Comparison:
    """``compare RUN_A RUN_B``: two runs, or the child runs of two parent runs, side by side."""
    from dashboards.compare import compare
    from dashboards.history import profiled

    (a, side_a), (b, side_b) = side_runs(run_a), side_runs(run_b)
    for r in (*side_a, *side_b):
        if profiled(r):
            console.print(
                f"[yellow]warning:[/] run {r.run_id} was profiled (relflow.profiled=true); "
                "its times include the profiler's overhead."
            )
    return compare(
        side_a,
        side_b,
        threshold=threshold,
        alpha=alpha,
        baseline_label=f"A {a.label}" + (f" ({len(side_a)} runs)" if side_a != [a] else ""),
        candidate_label=f"B {b.label}" + (f" ({len(side_b)} runs)" if side_b != [b] else ""),
    )


def compare_cmd(
    runs: Annotated[
        list[str] | None,
        typer.Argument(
            help="RUN_A RUN_B: baseline and candidate MLflow run ids; a parent run (relflow-bench noise) "
            "stands for its child runs."
        ),
    ] = None,
    experiment: Annotated[str | None, typer.Option(help="Experiment (spec name) for --baseline.")] = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            help="KEY=VALUE picking the baseline runs of --experiment by a tag (KEY or tags.KEY) or a param "
            "(params.KEY), e.g. relflow.git_sha=abc123 or params.run.batch_size=512."
        ),
    ] = None,
    candidate: Annotated[
        str | None,
        typer.Option(help="VALUE of the same key for the candidate runs (default: the one other value present)."),
    ] = None,
    threshold: Annotated[float, typer.Option(help="Smallest relative change worth marking (0.05 = 5%).")] = 0.05,
    alpha: Annotated[float, typer.Option(help="Significance level of the rank test.")] = 0.05,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the comparison as JSON.")] = None,
    include_profiled: Annotated[
        bool, typer.Option(help="Keep runs tagged relflow.profiled (slowed by the profiler) in --baseline groups.")
    ] = False,
    debug: Annotated[bool, typer.Option(help="Show tracebacks.")] = False,
) -> None:
    """Baseline vs candidate: key metrics side by side with ratios, marked when real.

    Significance comes only from independent runs (separate processes): one sample per run,
    Mann-Whitney U from 4 runs a side, Holm-corrected over the metrics tested, marked only beyond
    --threshold (a mark below the MDE is flagged). Request runs are judged per request (latency,
    each step's mean). One run against one run prints the ratio and says it cannot judge.
    Groups: two parent runs of relflow-bench noise, or --experiment E --baseline KEY=VALUE.
    The params and environment tags that differ are listed.
    """
    from dashboards.compare import as_dict

    try:
        if threshold < 0 or not 0 < alpha < 1:
            raise UserError(f"--threshold {threshold} must be >= 0 and --alpha {alpha} between 0 and 1.")
        if baseline is not None:
            if runs or experiment is None:
                raise UserError("--baseline KEY=VALUE needs --experiment E and no run ids.")
            c = compare_by_key(experiment, baseline, candidate, include_profiled, threshold, alpha)
        else:
            if not runs or len(runs) != 2:
                raise UserError("give two run ids (RUN_A RUN_B) or --experiment E --baseline KEY=VALUE.")
            c = compare_run_ids(runs[0], runs[1], threshold, alpha)
    except (Exception, KeyboardInterrupt) as err:  # noqa: BLE001
        fail(err, debug)
    print_comparison(c)
    if json_out is not None:
        json_out.write_text(json.dumps(as_dict(c), indent=2))


# --- history ------------------------------------------------------------------------


def history_cmd(
    spec_name: Annotated[str, typer.Argument(help="Spec name = MLflow experiment (e.g. tpch-orders).")],
    host_fingerprint: Annotated[
        str | None, typer.Option(help="Tag relflow.host_fingerprint to follow (default: the latest run's).")
    ] = None,
    spec_hash: Annotated[
        str | None, typer.Option(help="Tag relflow.spec_hash to follow (default: the latest run's; 'any' for all).")
    ] = None,
    min_segment: Annotated[int, typer.Option(help="Runs a new level must last to count as a step.")] = 3,
    threshold: Annotated[float, typer.Option(help="Smallest relative shift reported (0.05 = 5%).")] = 0.05,
    fail_on_regression: Annotated[
        bool, typer.Option(help=f"Exit {REGRESSION_EXIT} when a regression step is found.")
    ] = False,
    include_profiled: Annotated[
        bool, typer.Option(help="Keep runs tagged relflow.profiled (slowed by the profiler).")
    ] = False,
    debug: Annotated[bool, typer.Option(help="Show tracebacks.")] = False,
) -> None:
    """Report persistent steps (regressions, improvements) in one spec's throughput over time.

    Walks the FINISHED runs of one spec on one host fingerprint in start-time order; a step is a
    shift of the median that lasts --min-segment runs, so single outliers are not reported.
    """
    from dashboards.compare import differences, environment_tag
    from dashboards.history import HISTORY_METRICS, drop_invalid, history, select_history_runs
    from tasks.tracking.reader import search_runs

    try:
        if min_segment < 2:
            raise UserError("--min-segment must be at least 2 (one run is an outlier, not a step).")
        selected, host, spec = select_history_runs(
            search_runs(spec_name),
            host_fingerprint=host_fingerprint,
            spec_hash=spec_hash,
            include_profiled=include_profiled,
        )
        if not selected:
            raise UserError(
                f"no FINISHED benchmark runs of '{spec_name}' on host fingerprint {host} with spec hash {spec}."
            )
        runs, invalid = drop_invalid(selected)
        steps = [s for key in HISTORY_METRICS for s in history(runs, key, min_segment=min_segment, threshold=threshold)]
    except (Exception, KeyboardInterrupt) as err:  # noqa: BLE001
        fail(err, debug)
    # Every selected run INVALID (a busy host) is a history with nothing to judge, not bad
    # input: said, with the runs left out, and no step (so no regression exit).
    span = f"{runs[0].started_at:%Y-%m-%d %H:%M} .. {runs[-1].started_at:%Y-%m-%d %H:%M} UTC" if runs else "none VALID"
    out.print(f"{spec_name}: {len(runs)} FINISHED runs on host fingerprint {host}, spec hash {spec}, {span}")
    if invalid:
        out.print(
            f"[yellow]note:[/] left out {len(invalid)} INVALID run(s) (relflow.validity=INVALID; their figures "
            "are not measurements of the configuration): " + ", ".join(r.run_id[:8] for r in invalid)
        )
    if len(runs) < 2 * min_segment:
        out.print(f"[yellow]note:[/] a step needs {min_segment} runs on each side: {2 * min_segment} runs at least")
    table = Table(title="steps (persistent shifts of the median)", title_justify="left")
    for col in ("metric", "kind", "from run", "median before", "median after", "ratio", "z"):
        table.add_column(col)
    for s in steps:
        style = "bold red" if s.kind == "regression" else "bold green"
        table.add_row(
            s.metric,
            f"[{style}]{s.kind}[/]",
            s.after_run.label,
            f"{s.step.before:,.0f}",
            f"{s.step.after:,.0f}",
            f"{s.step.ratio:.3f}x",
            f"{s.step.z:.1f}",
        )
    if steps:
        show_table(table)
    else:
        out.print("no steps detected")
    for s in steps:
        diffs = differences([s.before_run], [s.after_run], "tags", environment_tag)
        diffs += differences([s.before_run], [s.after_run], "params")
        if diffs:
            out.print(
                f"at {s.after_run.label} ({s.metric}): "
                + "; ".join(f"{d.key}: {d.baseline} -> {d.candidate}" for d in diffs)
            )
    if fail_on_regression and any(s.kind == "regression" for s in steps):
        raise typer.Exit(REGRESSION_EXIT)


# --- dashboard ----------------------------------------------------------------------


def dashboard_cmd(
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for index.html and the PNGs.")],
    experiment: Annotated[
        str | None,
        typer.Option(help="Experiment (spec name); default: tpch-orders when present, else the most recently created."),
    ] = None,
    host_fingerprint: Annotated[
        str | None, typer.Option(help="Host for the history chart (default: latest run's).")
    ] = None,
    png: Annotated[
        bool,
        typer.Option(
            "--png/--no-png",
            help="Also write PNGs (Kaleido needs Chrome/Chromium: /usr/bin/chromium or BROWSER_PATH); "
            "without one the PNGs are skipped with a warning.",
        ),
    ] = True,
    log: Annotated[bool, typer.Option(help="Log the files to MLflow as a 'dashboard' run.")] = True,
    debug: Annotated[bool, typer.Option(help="Show tracebacks.")] = False,
) -> None:
    """Write a self-contained HTML report (Plotly, inline JS) plus PNGs from one experiment.

    The files are also logged as artifacts (dashboard/) of a new MLflow run in that experiment,
    tagged relflow.report=dashboard; benchmark runs are never modified.
    """
    from dashboards import report
    from tasks.tracking.reader import experiment_names, search_runs
    from tasks.tracking.uri import tracking_uri
    from tasks.tracking.writer import Tracker

    # as run's: exit 130, the files being drawn removed, the dashboard's MLflow run ended KILLED
    install_interrupts("the dashboard's unfinished files were removed and its MLflow run ended KILLED.")
    try:
        names = experiment_names()
        if experiment is None:
            candidates = [n for n in names if n != "Default"]
            if not candidates:
                raise UserError(f"no experiments in {mask_uri(tracking_uri())}: run `relflow-bench run` first.")
            experiment = "tpch-orders" if "tpch-orders" in candidates else candidates[-1]
        elif experiment not in names:
            raise UserError(f"no experiment '{experiment}' in {mask_uri(tracking_uri())} (have: {', '.join(names)}).")
        runs = search_runs(experiment)
        d = report.build(experiment, runs, host_fingerprint=host_fingerprint)
        if not d.runs:
            raise UserError(f"experiment '{experiment}' has no FINISHED benchmark runs to draw.")
        written = report.write(d, out_dir, mask_uri(tracking_uri()), png=png)  # the page shows its source
        files = written.files
        if written.png_skipped:
            console.print(f"warning: {written.png_skipped}")
        run_id = None
        if log:
            tracker = Tracker(experiment)
            run_id = tracker.start(
                f"{experiment}-dashboard",
                {
                    "relflow.report": "dashboard",
                    "relflow.dashboard_runs": str(len(d.runs)),
                    "relflow.host_fingerprint": str(d.host_fingerprint),
                },
            )
            try:
                for f in files:
                    tracker.log_artifact(f, "dashboard")
                tracker.finish()
            except BaseException as err:
                tracker.fail(err)
                raise
    except (Exception, KeyboardInterrupt) as err:  # noqa: BLE001
        fail(err, debug)
    out.print(f"dashboard of '{experiment}' ({len(d.runs)} runs, {len(d.steps)} history step(s)):")
    for f in files:
        out.print(f"  {f}")
    if run_id:
        out.print(f"logged to MLflow run {run_id} (artifacts under dashboard/)")


# --- ui -----------------------------------------------------------------------------


def ui_cmd(
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1.")] = 5000,
    host: Annotated[str, typer.Option(help="Interface to bind (keep the loopback unless you mean it).")] = "127.0.0.1",
) -> None:
    """Start the MLflow UI on the same store, light mode (one worker, no job execution).

    Prints the direct link to each benchmark experiment's runs table.
    """
    from tasks.tracking.reader import experiment_ids, runs_page
    from tasks.tracking.uri import default_artifact_root, tracking_uri

    uri = tracking_uri()
    if uri.startswith(("http://", "https://")):  # a shared `mlflow server` is its own UI
        out.print(f"MLFLOW_TRACKING_URI is a tracking server: open {mask_uri(uri)} in a browser (its UI).")
        raise typer.Exit(0)
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        uri,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    root = default_artifact_root(uri)
    if root:
        cmd += ["--artifacts-destination", root]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    base = f"http://{host}:{port}"
    console.print(f"MLflow UI on {base} for {mask_uri(uri)} (Ctrl-C stops it)")
    for name, exp_id in experiment_ids(uri).items():
        if name != "Default":
            out.print(f"  {name}: {runs_page(base, exp_id)}")
    proc = subprocess.Popen(cmd, env=env)

    def forward(signum: int, frame: object) -> None:
        # Ctrl-C or SIGTERM: stop the MLflow server we started (by its pid), then leave.
        proc.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
        if code != 0 and proc.returncode in (-signal.SIGTERM, 128 + signal.SIGTERM):
            code = 130
    finally:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for s, handler in previous.items():
            signal.signal(s, handler)
    raise typer.Exit(code)
