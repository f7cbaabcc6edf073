"""SIGTERM while ``relflow-bench dashboard`` draws its PNGs: exit 130, nothing left in
``--out`` and Chromium stopped, as ``run`` ends (tasks/runtime/interrupts.py, issue 24 item 3).

Before, the command died by the signal (exit 143) with ``index.html`` written and the PNGs
missing or half-written; a signal while it logged the files left its MLflow run RUNNING.

Named ``test_report_interrupt.py`` (tests/README.md): test_report.py is tasks/measure/report.py's
(pytest needs unique basenames); one of three aspects of dashboards/report.py (browser, interrupt,
no_browser).
"""

from __future__ import annotations

import shutil

import pytest
from cli_signals import terminate_when

pytestmark = pytest.mark.slow  # the session's benchmark runs, Kaleido and Chromium


def test_sigterm_while_drawing_exits_130_and_leaves_no_files(bench_runs, chromium, tmp_path):
    store = tmp_path / "mlflow.db"  # a copy: the report tests count the store's dashboard runs
    shutil.copy(bench_runs.uri.removeprefix("sqlite:///"), store)
    out = tmp_path / "dash"

    def drawing(pid: int) -> bool:  # the page is written (anywhere under --out): the PNGs come next
        return out.is_dir() and any(out.rglob("index.html"))

    code, err, seconds, alive = terminate_when(
        ["dashboard", "--experiment", "tpch-orders", "--out", str(out)],
        tmp_path,
        drawing,
        {"MLFLOW_TRACKING_URI": f"sqlite:///{store}", "BROWSER_PATH": chromium},
    )
    assert code == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == []  # no page, no PNG, no temporary folder
    assert not alive  # Kaleido's Chromium stopped with it
    assert seconds < 10
