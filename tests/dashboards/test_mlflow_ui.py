"""The MLflow UI as a user meets it: ``relflow-bench ui`` in a subprocess on a free port of
127.0.0.1 over the session's benchmark runs, its printed link opened in headless Chromium
(Playwright). The link must land on the experiment's runs table (not MLflow's GenAI
overview) showing every benchmark run with the tables it read, and a run page must show the
stage table and verdict as its description. The UI fixture lives in ``conftest.py``.
"""

from __future__ import annotations

import re

import pytest


@pytest.mark.slow
def test_ui_link_opens_on_the_runs_table_with_every_run(mlflow_ui, bench_runs, page):
    base, printed = mlflow_ui
    links = re.findall(r"tpch-orders: (\S+)", printed)
    assert len(links) == 1 and links[0].startswith(f"{base}/#/experiments/"), printed
    page.goto(links[0])
    names = page.get_by_text("tpch-orders-predict", exact=True)
    names.first.wait_for(timeout=120_000)
    assert "/runs" in page.url and "overview" not in page.url, page.url
    page.get_by_text(re.compile(r"\d+ matching runs")).wait_for(timeout=60_000)
    assert names.count() == 3  # the three benchmark runs
    body = page.inner_text("body")
    (bench_runs.folder / "ui_runs_table.txt").write_text(body)
    assert "No data available" not in body  # not the GenAI traces overview
    # the Dataset column names what each run read (the experiment is tpch-orders: look for
    # the other table)
    assert "lineitem" in body, body


@pytest.mark.slow
def test_run_page_shows_the_stage_table_and_verdict(mlflow_ui, bench_runs, page):
    base, printed = mlflow_ui
    link = re.search(r"tpch-orders: (\S+)", printed).group(1)
    page.goto(link.replace("/runs?", f"/runs/{bench_runs.a_512}?"))
    page.get_by_text("end-to-end").first.wait_for(timeout=120_000)
    body = page.inner_text("body")
    for stage in ("retrieve", "preprocess", "tensorize", "compute", "write"):
        assert stage in body
    assert "VALID" in body
