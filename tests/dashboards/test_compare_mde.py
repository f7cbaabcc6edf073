"""``compare`` shows the minimum detectable effect next to each ratio and never marks a change below it."""

from __future__ import annotations

import pytest

from dashboards.compare import BELOW_MDE, compare
from flows.cli.common import out
from flows.cli.reports import print_comparison
from tasks.measure.noise import cv, mde_two
from tasks.tracking.store import RunRecord

KEY = "compute.steady_rows_per_s"
# Every candidate run is faster than every baseline run (the rank test: p < 0.01), the medians
# 6% apart (beyond the 5% threshold), but one slow and one fast outlier make both sides so
# noisy that 6 runs a side can only show changes of about 30%.
BASE = [100.0, 100.0, 100.0, 100.0, 100.0, 60.0]
CAND = [106.0, 106.0, 106.0, 106.0, 106.0, 150.0]


def _runs(prefix: str, values: list[float]) -> list[RunRecord]:
    return [RunRecord(f"{prefix}{i}", "r", "e", "FINISHED", 0, 1, {KEY: v}, {}, {}) for i, v in enumerate(values)]


def test_a_significant_change_below_the_mde_is_not_marked():
    c = compare(_runs("a", BASE), _runs("b", CAND))
    row = {r.key: r for r in c.rows}[KEY]
    assert row.method == "Mann-Whitney U" and row.significant and row.p_value < 0.01
    assert row.ratio == pytest.approx(1.06)
    assert row.mde == pytest.approx(mde_two(cv(BASE), 6, cv(CAND), 6))
    assert row.mde > 0.25
    assert (row.marked, row.verdict) == (False, BELOW_MDE)


def test_a_change_beyond_the_mde_is_still_marked():
    quiet_base = [99.0, 100.0, 101.0, 100.0, 99.5, 100.5]
    quiet_cand = [v * 1.06 for v in quiet_base]
    row = {r.key: r for r in compare(_runs("a", quiet_base), _runs("b", quiet_cand)).rows}[KEY]
    assert row.mde < 0.02
    assert (row.marked, row.verdict) == (True, "improvement")


def test_the_printed_table_has_the_mde_column():
    with out.capture() as got:
        print_comparison(compare(_runs("a", BASE), _runs("b", CAND)))
    text = got.get()
    assert "MDE" in text
    row = {r.key: r for r in compare(_runs("a", BASE), _runs("b", CAND)).rows}[KEY]
    assert f"{row.mde:.1%}" in text
    assert "0 marked change(s)" in text
