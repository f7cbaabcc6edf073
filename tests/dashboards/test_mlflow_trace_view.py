"""A request you can open (issue 21): a short single_stream run's sampled requests, opened in
the MLflow UI (``relflow-bench ui``, a free port of 127.0.0.1) in headless Chromium, as a
user would find a p99 outlier's slow step.

MLflow 3.17's routes (read from its UI bundle, ``mlflow/server/js/build``):
``#/experiments/<id>/traces`` is the experiment's trace list (hidden by default: trace name,
run name), ``#/experiments/<id>/traces/<trace id>`` opens one trace's view over that list
(the UI rewrites it to ``?selectedEvaluationId=<trace id>``), and
``#/experiments/<id>/runs/<run id>/traces`` is the run page's Traces tab. The screenshot of
the slowest request's trace view is kept in the test's ``tmp_path`` as ``trace_view.png``.
"""

from __future__ import annotations

import re

import pytest
from mlflow.tracking import MlflowClient

STEPS = ("queue", "retrieve", "preprocess", "tensorize", "compute", "calibrate", "write")


def root_of(trace):
    return next(s for s in trace.data.spans if s.parent_id is None)


@pytest.fixture(scope="module")
def trace_ui(trace_run, start_ui, tmp_path_factory):
    with start_ui(trace_run.uri, trace_run.folder, tmp_path_factory.mktemp("trace_ui") / "ui.out") as ui:
        yield ui[0]


@pytest.fixture(scope="module")
def slowest(trace_run):
    """The run, its traces and the slowest request's trace (rank 1), read from the store."""
    client = MlflowClient(tracking_uri=trace_run.uri)
    run = client.get_run(trace_run.run_id)
    traces = client.search_traces(locations=[run.info.experiment_id], run_id=trace_run.run_id)
    ranked = [t for t in traces if root_of(t).attributes["relflow.latency_rank"].startswith("1 of ")]
    assert len(ranked) == 1, [root_of(t).attributes for t in traces]
    return run, traces, ranked[0]


def dismiss_guidance(page) -> None:
    """MLflow 3.17 opens a "Detect issues" tip over the trace list on a first visit; it takes
    every click until dismissed."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    got_it = page.get_by_text("Got it", exact=True)
    try:
        got_it.wait_for(timeout=10_000)  # it opens a moment after the list
    except PlaywrightTimeout:
        return  # already dismissed in this browser context, or a UI version without it
    got_it.click()


@pytest.mark.slow
def test_trace_list_links_each_trace_to_its_run(trace_ui, slowest, page):
    run, traces, _ = slowest
    exp = run.info.experiment_id
    page.goto(f"{trace_ui}/#/experiments/{exp}/traces")
    page.get_by_text(f"{len(traces)} of {len(traces)}", exact=True).wait_for(timeout=120_000)
    dismiss_guidance(page)
    # the run name is one of the columns MLflow hides by default: Display > Columns > Run name
    page.locator("[data-component-id='mlflow.traces-v4.display.trigger']").click()
    page.get_by_text("Columns", exact=True).hover()
    page.locator("[data-component-id='mlflow.traces-v4.column-selector.item.run_name']").click()
    page.keyboard.press("Escape")
    links = page.locator(f"a[href='#/experiments/{exp}/runs/{run.info.run_id}']")
    links.first.wait_for(timeout=60_000)
    assert links.count() == len(traces)
    assert set(links.all_inner_texts()) == {run.info.run_name}
    body = page.inner_text("body")
    # the default Input / Output columns say why each was traced and which step was slowest
    shown = sorted(re.findall(r'"slowest_step": ?"(\w+)"', body))
    assert shown == sorted(root_of(t).outputs["slowest_step"] for t in traces), body
    # the run page's Traces tab lists the same traces
    page.goto(f"{trace_ui}/#/experiments/{exp}/runs/{run.info.run_id}/traces")
    page.get_by_text(traces[0].info.trace_id).wait_for(timeout=120_000)
    body = page.inner_text("body")
    assert all(t.info.trace_id in body for t in traces)


@pytest.mark.slow
def test_trace_view_shows_every_step_and_the_slow_one(trace_ui, slowest, page, tmp_path):
    run, _, trace = slowest
    exp = run.info.experiment_id
    root = root_of(trace)
    page.goto(f"{trace_ui}/#/experiments/{exp}/traces/{trace.info.trace_id}")
    page.get_by_text("retrieve", exact=True).first.wait_for(timeout=120_000)
    assert f"selectedEvaluationId={trace.info.trace_id}" in page.url, page.url
    page.locator("[data-component-id='shared.model-trace-explorer.toggle-show-timeline']").click()
    page.wait_for_timeout(1000)  # the timeline draws after the click
    page.screenshot(path=tmp_path / "trace_view.png", full_page=True)
    body = page.inner_text("body")
    tree = body[body.index("Spans") :]
    # every step's span, in the order the steps started, under the request's root span; the UI
    # orders by start time, so steps that started at the same nanosecond (a 0 s queue wait and the
    # retrieve after it) may show in either order
    positions = {name: tree.find(f"\n{name}\n") for name in STEPS}
    assert -1 not in positions.values(), tree[:2000]
    started = {s.name: s.start_time_ns for s in trace.data.spans if s.name in STEPS}
    assert set(started) == set(STEPS), sorted(started)
    misordered = [(a, b) for a in STEPS for b in STEPS if started[a] < started[b] and positions[a] > positions[b]]
    assert not misordered, tree[:2000]
    assert root.name in tree
    n = int(run.data.metrics["latency.requests"])
    assert f"1 of {n} (1: slowest)" in body  # the root's relflow.latency_rank attribute
    # the slowest step named as the store has it, with its duration
    worst = max((s for s in trace.data.spans if s.parent_id is not None), key=lambda s: s.end_time_ns - s.start_time_ns)
    assert root.outputs["slowest_step"] == worst.name
    assert re.search(rf"slowest_step\W+{worst.name}", body), body
