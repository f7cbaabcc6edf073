"""The dashboard from real runs, rendered in headless Chromium (Debian's ``chromium``).

Chromium is driven over the DevTools protocol (``websockets``, already a Prefect
dependency): the page loads from a file URL, every console error, uncaught exception and
log error is collected, each chart's div must hold a drawn plot (``.main-svg``), and the
screenshot must be non-blank. A page with a deliberate error checks that errors are seen.
Chromium is installed by the set-up when absent and we are root (CI), else the tests skip.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
# Charts the session's runs have data for (predict-mode runs carry no meaningful quality, and
# no configuration is run with packing both auto and off: those two charts show a note).
DATA_CHARTS = ("stage_breakdown", "first_call_vs_steady", "history")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", "--window-size=1400,1000"]


@pytest.fixture(scope="session")
def chromium() -> str:
    if not Path(CHROMIUM).exists():
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            pytest.skip(f"{CHROMIUM} is absent and we are not root with apt-get: install Debian's chromium")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env, timeout=1200)
    return CHROMIUM


class Browser:
    """One headless Chromium on 127.0.0.1, spoken to over the DevTools protocol."""

    def __init__(self, binary: str, profile: Path, timeout: float = 120.0) -> None:
        # stderr goes to a file: a pipe nobody drains fills up and stalls the browser.
        self.log = profile / "chromium.log"
        with self.log.open("w") as err:
            self.proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                         stdout=subprocess.DEVNULL, stderr=err)
        self.port = None
        for _ in range(int(timeout * 10)):  # "DevTools listening on ws://127.0.0.1:PORT/devtools/..."
            m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", self.log.read_text())
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                break
            threading.Event().wait(0.1)
        if self.port is None:
            self.close()
            raise RuntimeError(f"chromium did not report a DevTools port:\n{self.log.read_text()[-2000:]}")

    def render(self, page: Path, timeout: float = 120.0) -> tuple[list[str], dict, bytes]:
        """Load ``page``; returns (errors, chart check, screenshot PNG)."""
        from websockets.sync.client import connect

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=30) as r:
            target = next(t for t in json.load(r) if t["type"] == "page")
        errors: list[str] = []
        with connect(target["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
            ids = iter(range(1, 10_000))

            def call(method: str, until_event: str | None = None, **params):
                i = next(ids)
                ws.send(json.dumps({"id": i, "method": method, "params": params}))
                result, seen_event = None, until_event is None
                while result is None or not seen_event:
                    msg = json.loads(ws.recv(timeout=timeout))
                    kind = msg.get("method")
                    if kind == "Runtime.exceptionThrown":
                        d = msg["params"]["exceptionDetails"]
                        errors.append(d.get("exception", {}).get("description") or d.get("text", "exception"))
                    elif kind == "Runtime.consoleAPICalled" and msg["params"]["type"] in ("error", "assert"):
                        errors.append(" ".join(str(a.get("value", a.get("description", "")))
                                               for a in msg["params"]["args"]))
                    elif kind == "Log.entryAdded" and msg["params"]["entry"]["level"] == "error":
                        errors.append(msg["params"]["entry"]["text"])
                    elif msg.get("id") == i:
                        if "error" in msg:
                            raise RuntimeError(f"{method}: {msg['error']}")
                        result = msg["result"]
                    elif kind is not None and kind == until_event:
                        seen_event = True
                return result

            call("Runtime.enable")
            call("Log.enable")
            call("Page.enable")
            call("Page.navigate", until_event="Page.loadEventFired", url=page.resolve().as_uri())
            check = call("Runtime.evaluate", returnByValue=True, awaitPromise=True, expression="""
                new Promise(done => setTimeout(() => done({
                  charts: [...document.querySelectorAll('.plotly-graph-div')].map(d => ({
                    id: d.id, drawn: d.querySelectorAll('.main-svg').length > 0,
                    traces: (d.data || []).length})),
                  height: document.body.scrollHeight}), 500))""")
            assert "exceptionDetails" not in check, check
            check = check["result"]["value"]
            call("Emulation.setDeviceMetricsOverride", width=1400, height=min(check["height"], 6000),
                 deviceScaleFactor=1, mobile=False)
            shot = call("Page.captureScreenshot", format="png")
        return errors, check, base64.b64decode(shot["data"])

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def browser(chromium, tmp_path_factory):
    b = Browser(chromium, tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


def non_blank_fraction(png: bytes) -> float:
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("L")
    hist = img.histogram()
    return 1 - hist[255] / sum(hist)  # share of pixels that are not pure white


@pytest.fixture(scope="module")
def dashboard_dir(bench_runs, chromium, tmp_path_factory):
    from typer.testing import CliRunner

    from flows.cli import app

    out = tmp_path_factory.mktemp("dashboard")
    res = CliRunner().invoke(app, ["dashboard", "--experiment", "tpch-orders", "--out", str(out)],
                             env={"MLFLOW_TRACKING_URI": bench_runs.uri, "BROWSER_PATH": chromium})
    assert res.exit_code == 0, res.output
    return out


@pytest.mark.slow
def test_dashboard_files_and_mlflow_run(dashboard_dir, bench_runs):
    from tasks.tracking import search_runs

    names = sorted(p.name for p in dashboard_dir.iterdir())
    assert names == ["first_call_vs_steady.png", "history.png", "index.html", "occupancy_vs_packing.png",
                     "quality_vs_throughput.png", "stage_breakdown.png"]
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
def test_dashboard_draws_in_headless_chromium(dashboard_dir, browser):
    errors, check, png = browser.render(dashboard_dir / "index.html")
    assert errors == []
    charts = {c["id"].removeprefix("fig-"): c for c in check["charts"]}
    assert len(charts) == 5 and all(c["drawn"] for c in charts.values()), check
    assert all(charts[name]["traces"] > 0 for name in DATA_CHARTS), check
    (dashboard_dir / "screenshot.png").write_bytes(png)
    assert non_blank_fraction(png) > 0.02


@pytest.mark.slow
def test_console_errors_are_seen(browser, tmp_path):
    page = tmp_path / "broken.html"
    page.write_text("<html><body><p>x</p><script>console.error('bad thing'); undefinedFn();</script></body></html>")
    errors, _, _ = browser.render(page)
    assert any("bad thing" in e for e in errors) and any("undefinedFn" in e for e in errors), errors
