"""preprocess (tasks/stages/preprocess.py) without Prefect.

The hand-made shop workload (tables in tests/conftest.py):
customers (root) -> orders (max_length 2, by o_date) -> lines (max_length 3, by l_no):
customer 1 has 3 orders (10, 11, 12), customer 3 none; order 10 has 4 lines, order 12 two.
"""

from __future__ import annotations

import copy
import datetime as dt
from decimal import Decimal

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from tasks.runtime.errors import UserError
from tasks.stages.preprocess import TRAIN, Preprocessed, preprocess, split_is_train
from tests.tasks.stages.conftest import lines_branch, orders_branch, retrieved_of, spec_of

# --- helpers ---------------------------------------------------------------------------


def rows_by_key(pre: Preprocessed) -> dict[int, dict]:
    return {r["c_id"]: r for r in pre.table.to_pylist()}


def order_totals(row: dict) -> list:
    return [o["o_total"] for o in row["orders"] or []]


def line_qtys(row: dict) -> list[list]:
    return [[line["l_qty"] for line in o["lines"] or []] for o in row["orders"] or []]


# --- preprocess --------------------------------------------------------------------------


def test_two_level_nesting_orders_and_truncates(pre):
    rows = rows_by_key(pre)
    assert pre.root_rows == 5 and pre.table.num_rows == 5
    assert list(rows) == [1, 2, 3, 4, 5]
    # customer 1: orders by o_date ascending, the third (order 12) over max_length 2
    assert order_totals(rows[1]) == [Decimal("100.50"), Decimal("200.00")]
    # order 10: lines by l_no, the fourth over max_length 3; nulls pass through
    assert line_qtys(rows[1]) == [[1.0, 2.0, None], [5.0]]
    assert [line["l_flag"] for line in rows[1]["orders"][0]["lines"]] == ["A", "B", "A"]
    # customer 4: order 41 (Jan 10) before order 40 (Jan 15); 41's lines by l_no (1, 2)
    assert order_totals(rows[4]) == [Decimal("20.00"), Decimal("10.00")]
    assert line_qtys(rows[4]) == [[10.0, 9.0], []]
    assert pre.child_rows == {"orders": 6, "lines": 7}


def test_root_rows_without_children_survive(pre):
    rows = rows_by_key(pre)
    assert not rows[3]["orders"]  # empty or null list, but the row is there
    assert not rows[5]["orders"][0]["lines"]
    assert [r["churn"] for r in rows.values()] == ["yes", "no", "no", "yes", "no"]


def test_nulls_and_decimals_pass_through(pre):
    rows = rows_by_key(pre)
    assert rows[2]["c_balance"] is None
    assert rows[3]["c_segment"] is None and rows[3]["c_since"] is None
    assert rows[2]["orders"][0]["o_date"] is None and rows[2]["orders"][0]["o_status"] is None
    assert rows[2]["orders"][0]["o_total"] == Decimal("50.25")
    assert pa.types.is_decimal(pre.table.schema.field("orders").type.value_type.field("o_total").type)
    assert rows[1]["c_since"] == dt.date(2020, 1, 1)


def test_overflow_counts_are_exact(pre):
    # one order (12) over customer 1's limit, one line (l_no 4) over order 10's limit;
    # order 12's two lines are skipped with their parent, not counted as overflow
    assert pre.overflow_dropped == {"orders": 1, "lines": 1}


def test_descending_order_and_children_of_dropped_parents(shop_spec, shop_tables):
    orders_branch(shop_spec)["order_by"]["descending"] = True
    pre = preprocess(spec_of(shop_spec), retrieved_of(shop_tables))
    rows = rows_by_key(pre)
    assert order_totals(rows[1]) == [None, Decimal("200.00")]  # orders 12, 11
    assert line_qtys(rows[1]) == [[6.0, 7.0], [5.0]]
    assert order_totals(rows[4]) == [Decimal("10.00"), Decimal("20.00")]  # 40, 41
    # order 10 (four lines) is dropped, so no line overflows anywhere
    assert pre.overflow_dropped == {"orders": 1, "lines": 0}
    assert pre.child_rows == {"orders": 6, "lines": 6}


def test_keep_last_keeps_the_tail_in_order(shop_spec, shop_tables):
    orders_branch(shop_spec)["overflow"] = "keep_last"
    lines_branch(shop_spec)["overflow"] = "keep_last"
    pre = preprocess(spec_of(shop_spec), retrieved_of(shop_tables))
    rows = rows_by_key(pre)
    assert order_totals(rows[1]) == [Decimal("200.00"), None]  # orders 11, 12
    assert line_qtys(rows[1]) == [[5.0], [6.0, 7.0]]
    # parents with fewer children than max_length keep them all
    assert order_totals(rows[4]) == [Decimal("20.00"), Decimal("10.00")]
    assert line_qtys(rows[2]) == [[8.0]]
    assert pre.overflow_dropped == {"orders": 1, "lines": 0}

    orders_branch(shop_spec)["order_by"]["descending"] = True  # now order 10 is in the tail
    pre = preprocess(spec_of(shop_spec), retrieved_of(shop_tables))
    assert line_qtys(rows_by_key(pre)[1]) == [[5.0], [2.0, None, 4.0]]
    assert pre.overflow_dropped == {"orders": 1, "lines": 1}


def test_sample_is_deterministic_per_seed_and_keeps_max_length(shop_spec, shop_tables):
    orders_branch(shop_spec)["overflow"] = "sample"
    lines_branch(shop_spec)["overflow"] = "sample"
    seen = set()
    for seed in range(8):
        raw = copy.deepcopy(shop_spec)
        raw["run"]["seed"] = seed
        first = preprocess(spec_of(raw), retrieved_of(shop_tables))
        again = preprocess(spec_of(raw), retrieved_of(shop_tables))
        assert first.table.equals(again.table)
        rows = rows_by_key(first)
        dates = [o["o_date"] for o in rows[1]["orders"]]
        assert len(dates) == 2 and dates == sorted(dates)  # a subset, still in order
        assert first.overflow_dropped["orders"] == 1
        order10 = [o for o in rows[1]["orders"] if o["o_total"] == Decimal("100.50")]
        if order10:
            numbers = [q for q in line_qtys({"orders": order10})[0]]
            assert len(numbers) == 3
            assert first.overflow_dropped["lines"] == 1
        else:
            assert first.overflow_dropped["lines"] == 0
        # parents within max_length keep everything
        assert line_qtys(rows[4]) == [[10.0, 9.0], []]
        seen.add(tuple(map(str, dates)))
    assert len(seen) > 1, "sample should not always keep the same rows"


@pytest.mark.parametrize(
    ("branch", "parent_key", "count", "table"),
    [("orders", 1, 3, "orders"), ("lines", 10, 4, "lines")],
)
def test_overflow_error_names_the_parent_key_and_the_fix(shop_spec, shop_tables, branch, parent_key, count, table):
    node = orders_branch(shop_spec) if branch == "orders" else lines_branch(shop_spec)
    node["overflow"] = "error"
    with pytest.raises(UserError) as info:
        preprocess(spec_of(shop_spec), retrieved_of(shop_tables))
    msg = str(info.value)
    assert f"Branch '{branch}'" in msg
    assert f"parent key {parent_key} has {count} rows in table '{table}'" in msg
    assert f"max_length to at least {count}" in msg
    assert "keep_first" in msg


def test_overflow_error_is_quiet_when_everything_fits(shop_spec, shop_tables):
    orders_branch(shop_spec).update(overflow="error", max_length=3)
    lines_branch(shop_spec).update(overflow="error", max_length=4)
    pre = preprocess(spec_of(shop_spec), retrieved_of(shop_tables))
    assert pre.overflow_dropped == {"orders": 0, "lines": 0}
    assert pre.child_rows == {"orders": 7, "lines": 10}


def test_overflow_error_ignores_children_of_dropped_parents(shop_spec, shop_tables):
    # order 10 (four lines) is dropped by the orders rule, so lines' error rule is not hit
    orders_branch(shop_spec)["order_by"]["descending"] = True
    lines_branch(shop_spec)["overflow"] = "error"
    pre = preprocess(spec_of(shop_spec), retrieved_of(shop_tables))
    assert pre.overflow_dropped == {"orders": 1, "lines": 0}


def test_split_is_deterministic_and_per_key():
    keys = pl.Series("k", np.arange(20_000, dtype=np.int64))
    a, b = split_is_train(keys, 0.2), split_is_train(keys, 0.2)
    assert a.equals(b)
    assert 0.77 < a.mean() < 0.83
    # a key's side does not depend on which other keys are in the chunk
    part = split_is_train(keys.slice(5_000, 100), 0.2)
    assert part.to_list() == a.slice(5_000, 100).to_list()
    text = pl.Series("k", [f"id-{i}" for i in range(5_000)])
    assert split_is_train(text, 0.3).equals(split_is_train(text, 0.3))
    assert 0.65 < split_is_train(text, 0.3).mean() < 0.75


def test_preprocess_split_matches_across_chunks(shop_spec, shop_tables):
    spec = spec_of(shop_spec)
    whole = preprocess(spec, retrieved_of(shop_tables))
    cust = shop_tables["customers"]
    half = dict(shop_tables, customers=cust.filter(pa.compute.is_in(cust["c_id"], pa.array([2, 5], pa.int64()))))
    part = preprocess(spec, retrieved_of(half))
    train = dict(zip(whole.table["c_id"].to_pylist(), whole.table[TRAIN].to_pylist(), strict=True))
    for k, t in zip(part.table["c_id"].to_pylist(), part.table[TRAIN].to_pylist(), strict=True):
        assert train[k] == t
