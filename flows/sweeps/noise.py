"""One configuration N times in fresh processes: its noise floor (``relflow-bench noise``).

Every run is a full ``relflow-bench run`` in its own process, one after another (each a child
MLflow run under one parent run), with its own Prefect temporary server, exactly as a user's
standalone run. The spread between them is what two identical runs of this configuration
differ by on this host; ``tasks.measure.noise`` turns it into the between-run CV and the
minimum detectable effect for the same number of runs a side, logged on the parent as
``noise.<metric>.cv`` / ``noise.<metric>.mde`` (tasks/measure/keys.py ``NOISE_METRICS``).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from pathlib import Path

from flows.sweeps.launch import launch_local
from tasks.measure import keys as K
from tasks.measure.noise import cv, mde
from tasks.measure.report import RunReport, markdown_table
from tasks.runtime.errors import UserError
from tasks.spec import Spec

DEFAULT_RUNS = 6
MIN_RUNS = 2  # a CV needs two values


def check_runs(runs: int) -> None:
    if runs < MIN_RUNS:
        raise UserError(
            f"--runs {runs}: a between-run spread needs at least {MIN_RUNS} runs; use --runs {DEFAULT_RUNS} "
            "(the default) or more"
        )


def collect(
    spec: Spec,
    spec_dir: Path,
    runs: int,
    parent_run_id: str,
    tracking_uri: str,
    on_run: Callable[[int, RunReport], None] | None = None,
) -> list[RunReport]:
    """``runs`` fresh-process runs of ``spec``; a failed one ends the command (its error)."""
    reports: list[RunReport] = []
    with tempfile.TemporaryDirectory(prefix="relflow-noise-") as tmp:
        for i in range(runs):
            got = launch_local(
                spec.to_dict(),
                name=f"noise-{i}",
                spec_dir=str(spec_dir),
                parent_run_id=parent_run_id,
                tags={"relflow.noise_run": str(i)},
                workdir=Path(tmp),
                tracking_uri=tracking_uri,
                api_url=None,  # each run starts its own temporary server, as a standalone run does
            )
            if got.summary is None:
                raise RuntimeError(f"noise run {i + 1} of {runs} failed (exit {got.returncode}): {got.error}")
            reports.append(got.summary)
            if on_run is not None:
                on_run(i, got.summary)
    return reports


def summarize(reports: list[RunReport]) -> dict[str, float]:
    """``noise.runs`` and, for each headline figure every run logged, its CV and MDE."""
    out = {K.NOISE_RUNS: float(len(reports))}
    for key in K.NOISE_METRICS:
        values = [r.metrics[key] for r in reports if key in r.metrics]
        if len(values) < MIN_RUNS or len(values) != len(reports):
            continue  # not logged by this configuration (train figures of a predict run)
        spread = cv(values)
        if math.isfinite(spread):
            out[K.noise(key, "cv")] = spread
            out[K.noise(key, "mde")] = mde(spread, len(values))
    return out


def to_markdown(reports: list[RunReport], figures: dict[str, float]) -> str:
    n = len(reports)
    rows = []
    for key in K.NOISE_METRICS:
        if K.noise(key, "cv") not in figures:
            continue
        values = sorted(r.metrics[key] for r in reports)
        rows.append(
            [
                key,
                f"{values[0]:,.0f}",
                f"{values[len(values) // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2:,.0f}",
                f"{values[-1]:,.0f}",
                f"{figures[K.noise(key, 'cv')]:.1%}",
                f"{figures[K.noise(key, 'mde')]:.1%}",
            ]
        )
    header = ["metric", "min", "median", "max", "CV between runs", f"MDE ({n} runs a side, 95%, 80% power)"]
    return markdown_table(header, rows)
