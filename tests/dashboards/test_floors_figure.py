"""The dashboard's floor ledger: one bar per stage from the latest run's floor fractions.

Named ``test_floors_figure.py`` (tests/README.md): test_floors.py is tasks/run/floors.py's
(pytest needs unique basenames)."""

from __future__ import annotations

from dashboards.floors import floor_ledger
from dashboards.report import build
from tasks.measure import keys as K
from tasks.tracking.reader import StoredRun


def _run(i: int, metrics: dict[str, float]) -> StoredRun:
    base = {K.E2E_PREDICT_ROWS_PER_S: 100.0}
    return StoredRun(f"id{i:030d}", f"run{i}", "e", "FINISHED", i, i + 1, base | metrics, {}, {})


def test_one_bar_per_stage_of_the_latest_run_with_floors():
    older = _run(0, {K.floor_fraction(s): 0.9 for s in K.FLOOR_STAGES})
    latest = _run(
        1,
        {
            K.floor_fraction("retrieve"): 0.3,
            K.floor_fraction("compute"): 0.05,
            K.floor_fraction("write"): 0.6,
            K.FLOOR_PREPROCESS_INPUT_BYTES_PER_S: 2e6,
            K.FLOOR_PREPROCESS_SHARE: 0.2,
        },
    )
    fig = floor_ledger([older, latest, _run(2, {})])  # the newest has no ledger: not drawn
    (bar,) = fig.data
    assert list(bar.x) == ["retrieve", "compute", "write"] and list(bar.y) == [0.3, 0.05, 0.6]
    assert latest.run_id[:8] in fig.layout.title.text and "preprocess 2.0 MB/s" in fig.layout.title.text


def test_runs_without_floors_draw_a_note_and_the_dashboard_has_the_chart():
    fig = floor_ledger([_run(0, {})])
    assert not fig.data and "no run with floor" in fig.layout.annotations[0].text
    assert "floor_ledger" in build("e", [_run(0, {})]).figures


def test_a_ledger_from_a_busy_host_is_drawn_untrusted_with_its_reasons():
    trusted = floor_ledger([_run(0, {K.floor_fraction("compute"): 0.3, K.FLOOR_OTHER_CPU_FRACTION: 0.02})])
    assert trusted.data[0].name == "vs floor" and "UNTRUSTED" not in trusted.layout.title.text
    busy = _run(
        1, {K.floor_fraction("compute"): 1.51, K.floor_fraction("tensorize"): 1.43, K.FLOOR_OTHER_CPU_FRACTION: 0.37}
    )
    fig = floor_ledger([busy])
    (bar,) = fig.data
    assert bar.name == "vs floor (untrusted)" and bar.marker.pattern.shape == "/"
    title = fig.layout.title.text
    assert "UNTRUSTED floors" in title and "floor.other_cpu_fraction 0.37" in title
    assert "floor.compute.fraction 1.51 > 1" in title and "floor.tensorize.fraction 1.43 > 1" in title
