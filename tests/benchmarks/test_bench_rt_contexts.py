"""bench_rt_contexts' ratio on scripted records, and each builder measured on the social folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_rt_contexts import measure, ratio_line, summarise, table_line  # noqa: E402


def record(builder: str, warm: float, cold: float, cells: float = 60.0) -> dict:
    return {
        "builder": builder,
        "rows": 100,
        "cold_s": 100 / cold,
        "warm_s": 100 / warm,
        "cold_contexts_per_s": cold,
        "warm_contexts_per_s": warm,
        "cells_mean": cells,
        "cells_p50": cells,
        "cells_max": int(cells) + 5,
        "strings": 10,
        "sets": [],
    }


def test_the_ratio_is_rt_utils_median_over_nested_median_per_round_too():
    recs = [
        record("nested", 400, 300, 100),
        record("rt_utils", 20, 10, 90),
        record("rt_utils", 40, 12, 92),
        record("nested", 500, 320, 100),
        record("nested", 450, 310, 100),
        record("rt_utils", 30, 11, 94),
    ]
    s = summarise(recs)
    assert s["warm_contexts_per_s"] == {"nested": 450.0, "rt_utils": 30.0}
    assert s["warm_ratio"] == pytest.approx(30 / 450)
    assert s["cold_ratio"] == pytest.approx(11 / 310)
    # round i pairs the i-th process of each builder
    assert s["round_warm_ratios"] == pytest.approx([20 / 400, 40 / 500, 30 / 450])
    assert s["cells_mean"] == {"nested": 100.0, "rt_utils": 92.0}
    assert "0.067x" in ratio_line(s) and "92.0 vs 100.0" in ratio_line(s)


def test_one_builder_alone_has_no_ratio():
    assert summarise([record("nested", 1, 1)]) == {}
    assert ratio_line({}) == "ratio: needs both builders"


def test_table_line_shows_the_figures():
    assert table_line(record("rt_utils", 25.0, 12.5, 61.5)).split() == [
        "rt_utils",
        "100",
        "8.00",
        "4.00",
        "25.0",
        "61.5",
        "62",
        "66",
    ]


@pytest.mark.slow
def test_each_builder_measures_the_same_rows_on_a_relbench_folder(tmp_path, monkeypatch):
    from tests.tasks.relbench_folders import social, spec_file

    monkeypatch.setenv("RELFLOW_DATA_DIR", str(tmp_path / "data"))
    folder = social(tmp_path / "social", users=30, posts=300)
    spec = spec_file(tmp_path, folder, "user-posts", extra="model: {d_model: 16, layers: 2, heads: 2}\n")
    budget = ["model.rt.context.max_context_cells=40", "model.rt.context.num_walks=100"]
    nested = measure(spec, "nested", 25, [])
    graph = measure(spec, "rt_utils", 25, budget)
    assert nested["rows"] == graph["rows"] == 25
    assert graph["cells_max"] <= 40 + 4  # the budget, overshot by at most one row (a post: 4 cells)
    # the warm call re-encodes the same strings: every one a CachedEncoder hit
    assert graph["cache_hits"] == graph["cache_misses"] == graph["strings"]
    assert graph["store_s"] > 0 and graph["assembly_s"] > 0
    assert graph["warm_contexts_per_s"] == pytest.approx(25 / graph["warm_s"])
