"""The dashboard: figures from one experiment's runs -> one self-contained HTML + PNGs.

The HTML inlines plotly.js once (no network: it opens offline and in CI's headless
Chromium). PNGs go through Kaleido, which drives a Chrome/Chromium: ``BROWSER_PATH`` when
set, else Debian's ``/usr/bin/chromium`` when present, else whatever Kaleido finds. With no
browser the page is still written and the PNGs are skipped with one warning naming the fix
(``Written.png_skipped``): Kaleido's own advice, a download, cannot work offline.
"""

from __future__ import annotations

import html
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from dashboards import figures
from dashboards.backends import backends_figure, rows_from_runs
from dashboards.floors import floor_ledger
from dashboards.history import HISTORY_METRICS, HistoryStep, drop_invalid, history, select_history_runs
from tasks.measure import keys as K
from tasks.runtime import interrupts
from tasks.tracking.reader import StoredRun

SYSTEM_CHROMIUM = "/usr/bin/chromium"
PNG_SIZE = dict(width=1200, height=560)


@dataclass
class Dashboard:
    experiment: str
    figures: dict[str, go.Figure]  # file stem -> figure, in page order
    runs: list[StoredRun]  # benchmark runs drawn
    history_runs: list[StoredRun]
    steps: list[HistoryStep]
    host_fingerprint: str | None
    spec_hash: str | None
    history_invalid: int = 0  # INVALID runs left out of the history chart


def build(experiment: str, runs: Sequence[StoredRun], *, host_fingerprint: str | None = None) -> Dashboard:
    """All dashboard figures for one experiment's runs (oldest first)."""
    bench = figures.benchmark_runs(runs)
    selected, host, spec = select_history_runs(runs, host_fingerprint=host_fingerprint, spec_hash=None)
    hist_runs, invalid = drop_invalid(selected)
    steps = [s for key in HISTORY_METRICS for s in history(hist_runs, key)]
    figs = {
        "stage_breakdown": figures.stage_breakdown(bench),
        "first_call_vs_steady": figures.first_call_vs_steady(bench),
        "quality_vs_throughput": figures.quality_vs_throughput(bench),
        "occupancy_vs_packing": figures.occupancy_vs_packing(bench),
        "floor_ledger": floor_ledger(bench),
        "history": figures.history_figure(hist_runs, steps),
    }
    backend_rows = rows_from_runs(runs)
    if backend_rows:  # children of a backends-report: the same chart as its parent's
        figs["backends"] = backends_figure(backend_rows)
    latency_runs = [r for r in bench if r.metrics.get(K.LATENCY_REQUESTS, 0) > 0]
    if latency_runs:  # request scenarios: the CDF series each run logged
        from tasks.tracking.reader import metric_history

        cdfs = {r.run_id: metric_history(r.run_id, K.LATENCY_CDF_MS) for r in latency_runs}
        figs["latency_cdf"] = figures.latency_cdf(latency_runs, cdfs)
    return Dashboard(experiment, figs, bench, hist_runs, steps, host, spec, len(invalid))


def to_html(d: Dashboard, source: str) -> str:
    """One page, plotly.js inline, each figure in its own div."""
    parts = [
        fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{name}", config={"displaylogo": False})
        for name, fig in d.figures.items()
    ]
    steps = (
        "".join(
            f"<li>{html.escape(s.metric)}: {s.kind} x{s.step.ratio:.3f} at run {html.escape(s.after_run.label)}</li>"
            for s in d.steps
        )
        or "<li>none detected</li>"
    )
    first = d.runs[0].start_time_ms if d.runs else 0
    last = d.runs[-1].start_time_ms if d.runs else 0
    span = (
        f"{d.runs[0].started_at:%Y-%m-%d %H:%M} to {d.runs[-1].started_at:%Y-%m-%d %H:%M} UTC"
        if first and last
        else "no runs"
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>relflow-bench dashboard: {html.escape(d.experiment)}</title>
<style>body{{font-family:sans-serif;margin:24px;max-width:1300px}} .fig{{margin-bottom:28px}}
code{{background:#f3f3f3;padding:1px 4px}}</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body>
<h1>relflow-bench: {html.escape(d.experiment)}</h1>
<p>{len(d.runs)} FINISHED benchmark runs ({span}) from <code>{html.escape(source)}</code>.
History: {len(d.history_runs)} runs on host fingerprint <code>{html.escape(str(d.host_fingerprint))}</code>,
spec hash <code>{html.escape(str(d.spec_hash))}</code> ({d.history_invalid} INVALID runs left out).
Steps:</p><ul>{steps}</ul>
{"".join(f'<div class="fig">{p}</div>' for p in parts)}
</body></html>
"""


def chrome_path() -> str | None:
    return os.environ.get("BROWSER_PATH") or (
        SYSTEM_CHROMIUM if Path(SYSTEM_CHROMIUM).exists() else shutil.which("chromium") or shutil.which("google-chrome")
    )


NO_BROWSER_FIX = "install one (`apt-get install -y chromium`), point BROWSER_PATH at one, or pass --no-png"


@dataclass(frozen=True)
class Written:
    files: list[Path]  # index.html, then the PNGs that were written
    png_skipped: str | None = None  # why there are no PNGs (no browser), with the fix


def write(d: Dashboard, out: Path, source: str, *, png: bool = True) -> Written:
    """Write ``index.html`` and one PNG per figure into ``out``; PNGs are skipped (and
    ``png_skipped`` says why) when no Chrome/Chromium can draw them.

    Drawn into a temporary folder inside ``out`` and moved in when complete: an error or a
    signal (Kaleido's PNGs take seconds) leaves neither a page without its PNGs nor a
    half-written PNG; the interrupt handler removes the folder, since it exits directly."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".dashboard-", dir=out))
    with interrupts.removed_on_exit(lambda: shutil.rmtree(tmp, ignore_errors=True)):
        drawn = _draw(d, tmp, source, png=png)
        files = []
        for f in drawn.files:
            os.replace(f, out / f.name)
            files.append(out / f.name)
        return Written(files, drawn.png_skipped)


def _draw(d: Dashboard, out: Path, source: str, *, png: bool) -> Written:
    page = out / "index.html"
    page.write_text(to_html(d, source), encoding="utf-8")
    if not png:
        return Written([page])
    set_path = os.environ.get("BROWSER_PATH")
    if set_path and not Path(set_path).is_file():
        return Written([page], f"no PNGs: BROWSER_PATH={set_path} is not a file; {NO_BROWSER_FIX}.")
    browser = chrome_path()
    if browser and not set_path:
        os.environ["BROWSER_PATH"] = browser  # Kaleido reads it
    import plotly.io as pio
    from kaleido.errors import ChromeNotFoundError

    paths = [out / f"{name}.png" for name in d.figures]
    try:
        pio.write_images(list(d.figures.values()), paths, **PNG_SIZE)
    except (ChromeNotFoundError, RuntimeError) as err:
        # plotly turns Kaleido's ChromeNotFoundError into a RuntimeError telling the user to
        # run plotly_get_chrome (a download); any other RuntimeError is a real failure
        if not isinstance(err, ChromeNotFoundError) and "requires Google Chrome" not in str(err):
            raise
        for p in paths:  # nothing half-written stays behind
            p.unlink(missing_ok=True)
        return Written([page], f"no PNGs: Kaleido found no Chrome/Chromium; {NO_BROWSER_FIX}.")
    return Written([page, *paths])
