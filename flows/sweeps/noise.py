"""One configuration N times in fresh processes: its noise floor (``relflow-bench noise``).

Every run is a full ``relflow-bench run`` in its own process, one after another (each a child
MLflow run under one parent run), with its own Prefect temporary server, exactly as a user's
standalone run. The spread between them is what two identical runs of this configuration
differ by on this host: the between-run CV of each run's sample (``run_sample``: its repeat
median over passes 1..N-1 when logged, else its figure; exactly what ``compare`` tests), and
the minimum detectable effect of the test ``compare`` would run between two such groups of N
runs: the rank test at Holm's first step over the metrics it would test
(``dashboards.compare.family_of_group``; ``tasks.measure.significance.rank_mde``). Logged on
the parent as ``noise.<metric>.cv`` / ``noise.<metric>.mde`` (tasks/measure/keys.py
``NOISE_METRICS``). Where N runs a side cannot mark anything (2 or 3 runs; 4 with 2+ metrics
tested; 5 with 7+), no MDE is logged and the table says "not enough runs".
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from pathlib import Path

from flows.sweeps.launch import launch_local
from tasks.measure import keys as K
from tasks.measure.noise import cv
from tasks.measure.report import RunSummary, markdown_table
from tasks.measure.significance import rank_mde, reachable, run_sample, runs_needed
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
    on_run: Callable[[int, RunSummary], None] | None = None,
) -> list[RunSummary]:
    """``runs`` fresh-process runs of ``spec``; a failed one ends the command (its error)."""
    reports: list[RunSummary] = []
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


def samples(reports: list[RunSummary], key: str) -> list[float]:
    """Each run's sample of ``key``, as compare reads it (runs that did not log it left out)."""
    return [v for r in reports if (v := run_sample(r.metrics, key)) is not None and math.isfinite(v)]


def family(reports: list[RunSummary]) -> int:
    """How many metrics compare would test between two groups of these runs (Holm's family)."""
    # dashboards.compare reads runs through tasks/tracking (MLflow: seconds to import); the
    # noise CLI imports this module before it validates the spec, which must stay instant.
    from dashboards.compare import family_of_group

    return max(len(family_of_group([r.metrics for r in reports])), 1)


def summarize(reports: list[RunSummary]) -> dict[str, float]:
    """``noise.runs`` and, for each headline figure every run logged, its CV and (where N runs
    a side can mark anything) the MDE of compare's rank test between two groups of N runs."""
    out = {K.NOISE_RUNS: float(len(reports))}
    m = family(reports)
    for key in K.NOISE_METRICS:
        values = samples(reports, key)
        if len(values) < MIN_RUNS or len(values) != len(reports):
            continue  # not logged by this configuration (train figures of a predict run)
        spread = cv(values)
        if math.isfinite(spread):
            out[K.noise(key, "cv")] = spread
            floor = rank_mde(spread, len(values), spread, len(values), family=m)
            if math.isfinite(floor):
                out[K.noise(key, "mde")] = floor
    return out


def not_enough(n: int, m: int) -> str:
    """Why N runs a side have no MDE: no outcome of them could be marked."""
    return f"not enough runs ({n} a side, {m} metrics tested: {runs_needed(m)} a side can mark a change)"


def to_markdown(reports: list[RunSummary], figures: dict[str, float]) -> str:
    n, m = len(reports), family(reports)
    rows = []
    for key in K.NOISE_METRICS:
        if K.noise(key, "cv") not in figures:
            continue
        values = sorted(samples(reports, key))
        mid = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
        floor = figures.get(K.noise(key, "mde"))
        rows.append(
            [
                key,
                f"{values[0]:,.0f}",
                f"{mid:,.0f}",
                f"{values[-1]:,.0f}",
                f"{figures[K.noise(key, 'cv')]:.1%}",
                f"{floor:.1%}" if floor is not None else not_enough(n, m),
            ]
        )
    header = [
        "metric",
        "min",
        "median",
        "max",
        "CV between runs",
        f"MDE ({n} runs a side; rank test, Holm over {m} metrics, 80% power)",
    ]
    table = markdown_table(header, rows)
    if reachable(n, n, m):
        return table
    return table + f"\n\nNote: {not_enough(n, m)}; compare marks nothing between two groups of {n} runs."
