"""The as-of rule (tasks/stages/asof.py): a time-anchored root row sees only rows up to its seed time,
before ordering and max_length apply, at every depth; worked out by hand on a few rows."""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from tasks.spec import parse_spec
from tasks.stages import asof
from tasks.stages.preprocess import FIT, SCORED, TRAIN, preprocess
from tasks.stages.retrieve import ROOT, Retrieved


def d(day: int) -> dt.datetime:
    return dt.datetime(2021, 1, day)


def spec(max_length: int = 2, overflow: str = "keep_first"):
    return parse_spec(
        {
            "name": "asof",
            "source": {"tables": {"rows": "r.parquet", "orders": "o.parquet", "lines": "l.parquet"}},
            "schema": {
                "root": {
                    "table": "rows",
                    "key": "k",
                    "entity": "cust",
                    "seed_time": "seed",
                    "split": "split",
                    "columns": {"age": "numeric"},
                },
                "branches": [
                    {
                        "name": "orders",
                        "table": "orders",
                        "parent_key": "cust",
                        "key": "oid",
                        "order_by": {"column": "at", "descending": True},
                        "time": "at",
                        "max_length": max_length,
                        "overflow": overflow,
                        "columns": {"amount": "numeric"},
                        "branches": [
                            {
                                "name": "lines",
                                "table": "lines",
                                "parent_key": "oid",
                                "time": "shipped",
                                "max_length": 4,
                                "columns": {"qty": "numeric"},
                            }
                        ],
                    }
                ],
            },
            "task": {"target": "y", "kind": "binary"},
        }
    )


ROWS = pa.table(
    {
        "k": ["1@05", "1@10", "2@10", "3@10"],
        "cust": [1, 1, 2, 3],
        "seed": [d(5), d(10), d(10), d(10)],
        "split": ["train", "val", "test", "test"],
        "age": [30.0, 30.0, 40.0, 50.0],
        "y": [0, 1, 1, 0],
    }
)
# customer 1: orders on days 2, 4, 7 (and one with an unknown date); customer 2: day 12 only
ORDERS = pa.table(
    {
        "cust": [1, 1, 1, 2, 1],
        "oid": [10, 11, 12, 20, 13],
        "at": [d(2), d(4), d(7), d(12), None],
        "amount": [1.0, 2.0, 3.0, 4.0, 5.0],
    }
)
# order 11 (day 4): one line shipped day 3, one day 6; order 12 (day 7): shipped day 8
LINES = pa.table({"oid": [11, 11, 12, 10], "shipped": [d(3), d(6), d(8), d(2)], "qty": [1.0, 2.0, 3.0, 4.0]})


def nested(s) -> dict[str, list]:
    pre = preprocess(s, Retrieved({ROOT: ROWS, "orders": ORDERS, "lines": LINES}, 0, ROWS.num_rows))
    df = pl.from_arrow(pre.table)
    assert isinstance(df, pl.DataFrame)
    return {
        row["k"]: [(o["amount"], [li["qty"] for li in (o["lines"] or [])]) for o in (row["orders"] or [])]
        for row in df.iter_rows(named=True)
    }, pre


def test_each_row_sees_only_rows_up_to_its_seed_time_at_every_depth():
    got, pre = nested(spec(max_length=8))
    # seed day 5: orders of days 4 and 2 (newest first); order 11's line shipped day 6 is after it
    assert got["1@05"] == [(2.0, [1.0]), (1.0, [4.0])]
    # seed day 10: every dated order of customer 1; all lines shipped by day 8; the undated order never
    assert got["1@10"] == [(3.0, [3.0]), (2.0, [1.0, 2.0]), (1.0, [4.0])]  # lines: no order_by, as read
    assert got["2@10"] == []  # its only order is on day 12
    assert got["3@10"] == []  # no orders at all: the row still flows through
    assert pre.child_rows == {"orders": 5, "lines": 6}


def test_max_length_cuts_after_the_filter_keeping_the_most_recent_rows():
    got, pre = nested(spec(max_length=1))
    assert got["1@05"] == [(2.0, [1.0])]  # day 4, not day 7 (after the seed)
    assert got["1@10"] == [(3.0, [3.0])]
    assert pre.overflow_dropped["orders"] == 1 + 2


def test_the_split_column_decides_train_fit_and_scored_rows():
    _, pre = nested(spec())
    t = pre.table
    assert t[TRAIN].to_pylist() == [True, False, False, False]
    assert t[FIT].to_pylist() == [False, True, False, False]  # val fits the calibration
    assert t[SCORED].to_pylist() == [False, False, True, True]  # test is scored


def test_the_as_of_floor_keeps_the_rows_preprocess_keeps():
    import duckdb

    from tasks.run.floors import asof_sql

    for max_length in (8, 1):
        s = spec(max_length=max_length)
        _, pre = nested(s)
        con = duckdb.connect()
        for node, t in {ROOT: ROWS, "orders": ORDERS, "lines": LINES}.items():
            con.register(f"n_{node}", t)
        for sql in asof_sql(s):
            con.execute(sql)
        kept = {b: con.execute(f"SELECT count(*) FROM i_{b}").fetchone()[0] for b in ("orders", "lines")}
        assert kept == pre.child_rows, max_length


@pytest.mark.parametrize(
    ("overflow", "order"),
    [
        ("keep_first", ("at", True)),  # the derived default: newest first, cut by ranges
        ("keep_first", ("at", False)),
        ("keep_last", ("at", True)),
        ("sample", ("amount", True)),
        ("keep_first", None),
    ],
)
def test_ranges_keep_exactly_what_join_then_filter_keeps(monkeypatch, overflow, order):
    """Random rows with many ties and nulls in time, several seed times per entity: the range
    cut (tasks/stages/asof.py ``_visible_by_ranges``) and the plain join-then-filter path give the
    same nested rows in the same order, the same overflow and the same kept counts."""
    rng = np.random.default_rng(7)
    n_rows, n_orders, n_lines = 60, 400, 900
    days = [d(int(x)) for x in rng.integers(1, 28, n_rows)]
    rows = pa.table(
        {
            "k": [f"{i:03d}" for i in range(n_rows)],
            "cust": rng.integers(0, 12, n_rows),
            "seed": days,
            "split": ["train"] * n_rows,
            "age": rng.normal(size=n_rows),
            "y": rng.integers(0, 2, n_rows),
        }
    )
    at = [None if rng.random() < 0.05 else d(int(x)) for x in rng.integers(1, 28, n_orders)]
    orders = pa.table(
        {
            "cust": rng.integers(0, 14, n_orders),  # some customers have no rows, some rows no customer
            "oid": np.arange(n_orders),
            "at": at,
            "amount": rng.integers(0, 5, n_orders).astype(float),  # ties
        }
    )
    shipped = [None if rng.random() < 0.05 else d(int(x)) for x in rng.integers(1, 28, n_lines)]
    lines = pa.table({"oid": rng.integers(0, n_orders, n_lines), "shipped": shipped, "qty": rng.normal(size=n_lines)})
    raw = spec(max_length=3, overflow=overflow).to_dict()
    b = raw["schema"]["branches"][0]
    b["order_by"] = {"column": order[0], "descending": order[1]} if order else None
    b["branches"][0] |= {"order_by": {"column": "shipped", "descending": True}, "max_length": 2}
    s = parse_spec(raw)
    got = {}
    for ranges in (True, False):
        monkeypatch.setattr(asof, "RANGES", ranges)
        pre = preprocess(s, Retrieved({ROOT: rows, "orders": orders, "lines": lines}, 0, n_rows))
        got[ranges] = (pre.table.to_pylist(), pre.overflow_dropped, pre.child_rows)
    assert got[True] == got[False]
    assert got[True][2]["orders"] > 0 and got[True][1]["orders"] > 0  # something kept, something cut
