"""flows/sweeps/budget.py: which keys are context sizes, the default grid, each point's figures
from its child's metrics (per prediction, RelBench or harness quality), ranking and the table."""

from __future__ import annotations

import copy

import pytest

from flows.sweeps.budget import (
    RT_MAX_CELLS,
    BudgetPoint,
    check_context_keys,
    child_metrics,
    default_grid,
    figures,
    front_text,
    is_context_key,
    points_from_sweep,
    rank,
    to_markdown,
)
from flows.sweeps.models_report import headline
from tasks.measure import keys as K
from tasks.runtime.errors import UserError


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("orders.max_length", True),
        ("lineitem.overflow", True),
        ("schema.branches.orders.max_length", True),
        (RT_MAX_CELLS, True),
        ("model.rt.context.bfs_width", True),
        ("run.batch_size", False),
        ("max_length", False),
        ("model.d_model", False),
        ("orders.reduce", False),
    ],
)
def test_context_keys(key, ok):
    assert is_context_key(key) is ok


def test_a_grid_that_is_not_context_sizes_or_has_one_point_is_refused():
    with pytest.raises(UserError, match=r"run\.batch_size .*not context sizes.*relflow-bench sweep"):
        check_context_keys({"run.batch_size": [64, 256], "orders.max_length": [4, 8]})
    with pytest.raises(UserError, match="at least two context sizes"):
        check_context_keys({"orders.max_length": [4]})
    check_context_keys({"orders.max_length": [4], "orders.overflow": ["keep_first", "keep_last"]})


def test_default_grid_quarter_half_all_of_each_top_branch_or_rt_cells(shop_spec):
    from tasks.spec import parse_spec

    raw = copy.deepcopy(shop_spec)
    raw["schema"]["branches"][0]["max_length"] = 16  # orders; its nested lines are not top-level
    assert default_grid(parse_spec(raw)) == {"orders.max_length": [4, 8, 16]}
    raw["model"] = {**raw["model"], "library": "relational_transformers"}
    raw["model"]["rt"] = {"context": {"builder": "rt_utils", "max_context_cells": 512}}
    assert default_grid(parse_spec(raw)) == {RT_MAX_CELLS: [128, 256, 512, 1024, 2048]}  # Library.budget_grid
    raw["model"]["rt"] = {"context": {"builder": "nested"}}  # the nested builder's context is its branches'
    assert default_grid(parse_spec(raw)) == {"orders.max_length": [4, 8, 16]}
    raw["schema"]["branches"][0]["max_length"] = 1
    with pytest.raises(UserError, match="no default budget grid"):
        default_grid(parse_spec(raw))


METRICS = {
    K.E2E_PREDICT_SECONDS: 2.0,
    K.E2E_PREDICT_ROWS: 1000.0,
    K.stage_seconds("compute", "predict"): 1.5,
    K.stage_seconds("retrieve", "predict"): 0.25,
    K.DATA_COORDS_PRESENT: 50_000.0,
    K.DATA_PADDED_COORDS: 80_000.0,
    K.DATA_ROWS_PREDICTED: 1000.0,
    K.HOST_PEAK_BYTES: 512 * 2**20,
    "relbench.roc_auc": 0.61,
    "relbench.roc_auc.ci_low": 0.58,
    "relbench.roc_auc.ci_high": 0.64,
    "quality.auc": 0.60,
    "quality.auc.ci_low": 0.5,
    "quality.auc.ci_high": 0.7,
}


def test_figures_per_prediction_and_relbench_quality_for_a_relbench_task():
    p = figures(BudgetPoint(0, "max_length=4", {}, "FINISHED", "r0"), METRICS, headline("binary", relbench=True))
    assert p.ms_per_prediction == pytest.approx(2.0)  # 2 s over 1000 predictions
    assert p.stage_ms_per_prediction == {"retrieve": pytest.approx(0.25), "compute": pytest.approx(1.5)}
    assert p.cells_present_per_prediction == 50 and p.cells_padded_per_prediction == 80
    assert p.peak_rss_mib == 512
    assert (p.quality, p.quality_low, p.quality_high) == (0.61, 0.58, 0.64)
    # not a RelBench task: the harness's quality and interval
    q = figures(BudgetPoint(0, "x", {}, "FINISHED", "r0"), METRICS, headline("binary"))
    assert (q.quality, q.quality_low, q.quality_high) == (0.60, 0.5, 0.7)


def _point(i: int, q: float, low: float, high: float, ms: float) -> BudgetPoint:
    p = BudgetPoint(i, f"max_length={i}", {}, "FINISHED", f"run{i}", validity="VALID")
    p.quality, p.quality_low, p.quality_high, p.ms_per_prediction = q, low, high, ms
    return p


def test_rank_marks_the_front_and_the_table_says_who_dominates_whom():
    points = [
        _point(0, 0.60, 0.55, 0.65, 1.0),  # cheap, worse
        _point(1, 0.80, 0.75, 0.85, 3.0),  # dear, better: disjoint from #1, on the front
        _point(2, 0.62, 0.57, 0.67, 2.0),  # overlaps #1 (not ranked against it), dominated by nothing
        _point(3, 0.50, 0.45, 0.52, 4.0),  # worse than all, dearest: dominated by #1, #2 and #3
        BudgetPoint(4, "max_length=32", {}, "FAILED", None, error="boom"),
    ]
    rank(points, higher_is_better=True)
    assert [front_text(p) for p in points] == ["front", "front", "front", "dominated by #1, #2, #3", "not ranked"]
    assert child_metrics(points[3])[K.BUDGET_ON_FRONT] == 0.0
    assert child_metrics(points[3])[K.BUDGET_DOMINATED_BY] == 3.0
    assert child_metrics(points[1])[K.BUDGET_ON_FRONT] == 1.0
    assert K.BUDGET_ON_FRONT not in child_metrics(points[4])
    md = to_markdown(points, headline("binary", relbench=True))
    assert "| 4 | max_length=3 | 0.5000 [0.4500, 0.5200] | dominated by #1, #2, #3 | 4.000 |" in md
    assert "FAILED: boom" in md and "overlapping intervals are not ranked" in md


def test_points_from_sweep_reads_each_child_and_notes_invalid_ranked_points():
    summary = {
        "rows": [
            {"index": 0, "config": "max_length=4", "values": {"orders.max_length": "4"}, "status": "FINISHED",
             "run_id": "a", "validity": "VALID"},
            {"index": 1, "config": "max_length=8", "values": {"orders.max_length": "8"}, "status": "FAILED",
             "run_id": "b", "error": "exit 1"},
        ]
    }  # fmt: skip
    tags = {"relflow.validity": "INVALID", "relflow.invalid_reasons": "host busy; too few steady batches"}
    read = {"a": (METRICS, tags)}
    h = headline("binary", relbench=True)
    points = points_from_sweep(summary, h, lambda run_id: read[run_id])
    assert points[0].validity == "INVALID" and points[0].invalid_reasons == ["host busy", "too few steady batches"]
    assert points[0].ms_per_prediction == pytest.approx(2.0) and points[1].quality is None
    rank(points, h.higher_is_better)
    assert "#1: host busy, too few steady batches" in to_markdown(points, h)
