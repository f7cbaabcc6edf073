"""dashboards/budget.py: the budget chart draws front and dominated points apart, with their
intervals, joins the front in cost order, and writes HTML (and PNG with a browser)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dashboards.budget import budget_figure, write_chart
from flows.sweeps.budget import BudgetPoint, rank


def _point(i: int, q: float, low: float, high: float, ms: float) -> BudgetPoint:
    p = BudgetPoint(i, f"orders.max_length={2**i}", {}, "FINISHED", f"r{i}")
    p.quality, p.quality_low, p.quality_high, p.ms_per_prediction = q, low, high, ms
    return p


def _points() -> list[BudgetPoint]:
    pts = [_point(0, 0.6, 0.55, 0.65, 1.0), _point(1, 0.8, 0.75, 0.85, 3.0), _point(2, 0.5, 0.45, 0.52, 4.0)]
    rank(pts, higher_is_better=True)
    return pts


def test_front_and_dominated_traces_with_intervals():
    fig = budget_figure(_points(), "relbench.roc_auc", True)
    by_name = {t.name: t for t in fig.data if t.name}
    front, dominated = by_name["Pareto front"], by_name["dominated"]
    assert list(front.x) == [1.0, 3.0] and list(front.text) == ["#1", "#2"]
    assert list(dominated.x) == [4.0]
    assert list(front.error_y.array) == pytest.approx([0.05, 0.05])
    assert list(dominated.error_y.arrayminus) == pytest.approx([0.05])
    line = [t for t in fig.data if t.mode == "lines"][0]
    assert list(line.x) == [1.0, 3.0]  # the front joined in cost order
    assert "higher is better" in fig.layout.yaxis.title.text


def test_write_chart_html_without_png(tmp_path: Path):
    written = write_chart(budget_figure(_points(), "q", True), tmp_path, "budget", png=False)
    assert written.files == [tmp_path / "budget.html"] and written.png_skipped is None
    assert "plotly" in (tmp_path / "budget.html").read_text()[:200_000].lower()


def test_a_missing_browser_skips_the_png_and_says_why(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-chrome"))
    written = write_chart(budget_figure(_points(), "q", True), tmp_path, "budget")
    assert written.files == [tmp_path / "budget.html"]
    assert written.png_skipped is not None and "BROWSER_PATH" in written.png_skipped
