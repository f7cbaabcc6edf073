"""The dashboard from real runs, rendered in headless Chromium (Playwright, Debian's ``chromium``).

The page loads from a file URL; every console error and uncaught exception is collected, each
chart's div must hold a drawn plot (``.main-svg``), and the screenshot must be non-blank. A
page with a deliberate error checks that errors are seen. The browser fixtures live in
``tests/conftest.py``.

Named ``test_report_browser.py`` (tests/README.md): test_report.py is tasks/measure/report.py's
(pytest needs unique basenames); one of three aspects of dashboards/report.py (browser, interrupt,
no_browser).
"""

from __future__ import annotations

import io
import re

import pytest

# Charts the session's runs have data for (predict-mode runs carry no meaningful quality, and
# no configuration is run with packing both auto and off: those two charts show a note).
DATA_CHARTS = ("stage_breakdown", "first_call_vs_steady", "history")
# every chart an offline benchmark experiment's page carries, in no order
PAGE_CHARTS = (
    "stage_breakdown",
    "first_call_vs_steady",
    "quality_vs_throughput",
    "occupancy_vs_packing",
    "floor_ledger",
    "history",
)
CHART_CHECK = """() => ({
  charts: [...document.querySelectorAll('.plotly-graph-div')].map(d => ({
    id: d.id, drawn: d.querySelectorAll('.main-svg').length > 0, traces: (d.data || []).length})),
  height: document.body.scrollHeight})"""


def render(page, path):
    """Load ``path``; returns (chart check, full-page screenshot PNG)."""
    page.goto(path.resolve().as_uri(), wait_until="load")
    page.wait_for_timeout(500)  # Plotly draws after load
    check = page.evaluate(CHART_CHECK)
    return check, page.screenshot(full_page=True)


def non_blank_fraction(png: bytes) -> float:
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("L")
    hist = img.histogram()
    return 1 - hist[255] / sum(hist)  # share of pixels that are not pure white


@pytest.fixture(scope="module")
def dashboard_dir(bench_runs, chromium, tmp_path_factory):
    from typer.testing import CliRunner

    from flows.cli.app import app

    out = tmp_path_factory.mktemp("dashboard")
    res = CliRunner().invoke(
        app,
        ["dashboard", "--experiment", "tpch-orders", "--out", str(out)],
        env={"MLFLOW_TRACKING_URI": bench_runs.uri, "BROWSER_PATH": chromium},
    )
    assert res.exit_code == 0, res.output
    return out


@pytest.mark.slow
def test_dashboard_files_and_mlflow_run(dashboard_dir, bench_runs):
    from tasks.tracking.reader import search_runs

    names = sorted(p.name for p in dashboard_dir.iterdir())
    assert names == sorted([*(f"{c}.png" for c in PAGE_CHARTS), "index.html"])
    for png in dashboard_dir.glob("*.png"):  # a chart without data still draws its note
        assert non_blank_fraction(png.read_bytes()) > 0.002, png.name
    for name in DATA_CHARTS:
        assert non_blank_fraction((dashboard_dir / f"{name}.png").read_bytes()) > 0.01, name
    html = (dashboard_dir / "index.html").read_text()
    # opens offline: no script is fetched from anywhere (plotly.js itself is inline and its
    # source contains the text "<script src=", so look for real external script tags)
    assert not re.search(r'<script[^>]*\ssrc=["\']?(https?:)?//', html)
    for run_id in (bench_runs.a_512, bench_runs.b_512, bench_runs.c_16):
        assert run_id[:8] in html
    (dash,) = [r for r in search_runs("tpch-orders", uri=bench_runs.uri) if r.tags.get("relflow.report") == "dashboard"]
    from mlflow.tracking import MlflowClient

    logged = {f.path for f in MlflowClient(bench_runs.uri).list_artifacts(dash.run_id, "dashboard")}
    assert "dashboard/index.html" in logged and "dashboard/history.png" in logged


@pytest.mark.slow
def test_dashboard_draws_in_headless_chromium(dashboard_dir, page):
    check, png = render(page, dashboard_dir / "index.html")
    assert page.errors == []
    charts = {c["id"].removeprefix("fig-"): c for c in check["charts"]}
    assert sorted(charts) == sorted(PAGE_CHARTS) and all(c["drawn"] for c in charts.values()), check
    assert all(charts[name]["traces"] > 0 for name in DATA_CHARTS), check
    (dashboard_dir / "screenshot.png").write_bytes(png)
    assert non_blank_fraction(png) > 0.02


@pytest.mark.slow
def test_console_errors_are_seen(page, tmp_path):
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><p>x</p><script>console.error('bad thing'); undefinedFn();</script></body></html>")
    render(page, broken)
    assert any("bad thing" in e for e in page.errors) and any("undefinedFn" in e for e in page.errors), page.errors
