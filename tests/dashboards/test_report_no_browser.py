"""The dashboard on a machine without Chrome/Chromium: the page is written, the PNGs are
skipped with one warning naming the fix, and the command succeeds.

No browser is simulated the way a user gets it wrong or has none: ``BROWSER_PATH`` pointing
at a file that does not exist (Kaleido reads that variable first), which works whether or
not this machine has Chromium. Where no browser is installed at all (nothing on ``PATH``,
no ``/usr/bin/chromium``), the second case runs Kaleido's own search and its failure.

Named ``test_report_no_browser.py`` (tests/README.md): test_report.py is tasks/measure/report.py's
(pytest needs unique basenames); one of three aspects of dashboards/report.py (browser, interrupt,
no_browser).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from dashboards import report

MISSING = "/nonexistent/chromium"


def _no_browser_installed() -> bool:
    return not any(
        (Path("/usr/bin/chromium").exists(), shutil.which("chromium"), shutil.which("google-chrome"))
    ) and not os.environ.get("BROWSER_PATH")


def test_browser_path_at_a_missing_file_writes_the_page_and_skips_the_pngs(tmp_path, monkeypatch):
    monkeypatch.setenv("BROWSER_PATH", MISSING)
    d = report.build("empty", [])  # every chart draws its "no data" note
    written = report.write(d, tmp_path, "sqlite:///x.db", png=True)
    assert written.files == [tmp_path / "index.html"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.html"]
    msg = written.png_skipped
    assert msg and f"BROWSER_PATH={MISSING}" in msg
    assert "apt-get install -y chromium" in msg and "--no-png" in msg


@pytest.mark.skipif(not _no_browser_installed(), reason="a browser is installed here: Kaleido would find it")
def test_no_browser_anywhere_is_kaleidos_search_failing_and_skips_the_pngs(tmp_path, monkeypatch):
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    d = report.build("empty", [])
    written = report.write(d, tmp_path, "sqlite:///x.db", png=True)
    assert written.files == [tmp_path / "index.html"]
    assert written.png_skipped and "Kaleido found no Chrome/Chromium" in written.png_skipped
    assert "BROWSER_PATH" not in os.environ  # nothing was set for Kaleido when there was nothing to point at


def test_no_png_writes_only_the_page_without_a_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("BROWSER_PATH", MISSING)
    written = report.write(report.build("empty", []), tmp_path, "sqlite:///x.db", png=False)
    assert written == report.Written([tmp_path / "index.html"])


@pytest.mark.slow
def test_dashboard_command_without_a_browser_exits_0_with_one_warning(bench_runs, tmp_path):
    from typer.testing import CliRunner

    from flows.cli.app import app

    out = tmp_path / "dash"
    res = CliRunner().invoke(
        app,
        ["dashboard", "--experiment", "tpch-orders", "--out", str(out), "--no-log"],
        env={"MLFLOW_TRACKING_URI": bench_runs.uri, "BROWSER_PATH": MISSING},
    )
    assert res.exit_code == 0, res.output
    assert res.output.count("warning:") == 1 and "--no-png" in res.output, res.output
    assert sorted(p.name for p in out.iterdir()) == ["index.html"]
    assert bench_runs.a_512[:8] in (out / "index.html").read_text()
