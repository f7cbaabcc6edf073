"""The LightGBM baseline's flattening (tasks/libraries/lightgbm/features.py), exact, on a nested
table made by hand: nulls, an empty and a null list, a nested branch, category values outside the
training rows' vocabulary, and rows after the seed time, which no feature may see; then the same
rows from flat tables through the harness's own preprocess (the as-of cut)."""

from __future__ import annotations

import math
from datetime import date, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tasks.libraries.lightgbm import features as F
from tasks.spec import parse_spec

NAN = math.nan
SEED = datetime(2024, 1, 10)


def _spec() -> Any:
    return parse_spec(
        {
            "name": "anchored",
            "source": {"tables": {t: f"{t}.parquet" for t in ("users", "orders", "lines")}},
            "schema": {
                "root": {
                    "table": "users",
                    "key": "rid",
                    "entity": "uid",
                    "seed_time": "seed",
                    "columns": {"age": "numeric", "seg": "category", "joined": "timestamp"},
                },
                "branches": [
                    {
                        "name": "orders",
                        "table": "orders",
                        "parent_key": "o_user",
                        "key": "o_id",
                        "time": "o_t",
                        "order_by": {"column": "o_t", "descending": True},
                        "max_length": 10,
                        "columns": {"o_t": "timestamp", "amount": "numeric", "status": "category"},
                        "branches": [
                            {
                                "name": "lines",
                                "table": "lines",
                                "parent_key": "l_order",
                                "time": "l_t",
                                "max_length": 10,
                                "columns": {"l_t": "timestamp", "qty": "numeric"},
                            }
                        ],
                    }
                ],
            },
            "task": {"target": "y", "kind": "binary"},
            "model": {"library": "lightgbm"},
        }
    )


LINE = pa.struct([("l_t", pa.timestamp("ns")), ("qty", pa.float64())])
ORDER = pa.struct(
    [("o_t", pa.timestamp("us")), ("amount", pa.float64()), ("status", pa.string()), ("lines", pa.list_(LINE))]
)


def _nested() -> pa.Table:
    """Three root rows as preprocess would hand them, except that row 1 still holds an order
    and a line after its seed time (2024-01-10), which the features must leave out."""
    orders = [
        [
            {
                "o_t": datetime(2024, 1, 5),
                "amount": 10.0,
                "status": "a",
                "lines": [
                    {"l_t": datetime(2024, 1, 6), "qty": 1.0},
                    {"l_t": datetime(2024, 1, 20), "qty": 100.0},  # after the seed time
                ],
            },
            {"o_t": datetime(2024, 1, 8), "amount": None, "status": None, "lines": []},
            {  # after the seed time, with a line before it: neither may count
                "o_t": datetime(2024, 1, 15),
                "amount": 1000.0,
                "status": "a",
                "lines": [{"l_t": datetime(2024, 1, 9), "qty": 7.0}],
            },
        ],
        [],  # no orders
        None,  # no orders (a null list)
    ]
    return pa.table(
        {
            "rid": pa.array([1, 2, 3], pa.int64()),
            "seed": pa.array([SEED] * 3, pa.timestamp("us")),
            "uid": pa.array([7, 8, 9], pa.int64()),
            "age": pa.array([30.0, 40.0, None]),
            "seg": pa.array(["x", "y", "z"]).dictionary_encode(),  # z: not in a training row
            "joined": pa.array([date(2024, 1, 1), None, date(2023, 12, 31)], pa.date32()),
            "y": pa.array([1, 0, 1], pa.int32()),
            "orders": pa.array(orders, pa.list_(ORDER)),
            "__train": pa.array([True, True, False]),
            "__fit": pa.array([False, False, True]),
            "__scored": pa.array([False, False, True]),
        }
    )


NAMES = (
    "age",
    "seg",
    "joined",
    "orders.count",
    *(f"orders.o_t.{a}" for a in ("mean", "min", "max", "last")),
    *(f"orders.amount.{a}" for a in ("mean", "min", "max", "last")),
    "orders.status=a",
    f"orders.status={F.OTHER}",
    "lines.count",
    *(f"lines.l_t.{a}" for a in ("mean", "min", "max", "last")),
    *(f"lines.qty.{a}" for a in ("mean", "min", "max", "last")),
)
# Row 1, as of 2024-01-10: orders on 01-05 (10.0, 'a') and 01-08 (null, null), i.e. 5 and 2
# days before the seed; the newest (last in time) is 01-08, whose amount is null. Its one
# visible line: 01-06 (4 days), qty 1. Rows 2 and 3: no rows, counts 0, the rest missing.
EXPECTED = np.array(
    [
        [30.0, 0.0, 9.0, 2.0, 3.5, 2.0, 5.0, 2.0, 10.0, 10.0, 10.0, NAN, 1.0, 0.0, 1.0, 4, 4, 4, 4, 1, 1, 1, 1],
        [40.0, 1.0, NAN, 0.0, *[NAN] * 8, 0.0, 0.0, 0.0, *[NAN] * 8],
        [NAN, NAN, 10.0, 0.0, *[NAN] * 8, 0.0, 0.0, 0.0, *[NAN] * 8],
    ]
)


def test_features_are_exact_and_see_no_row_after_the_seed_time():
    spec, table = _spec(), _nested()
    fl = F.fit(spec, table)
    assert fl.names == NAMES
    assert fl.categorical == (1,)  # seg, a LightGBM category
    # vocabularies from the training rows only (rows 1 and 2): z never, the post-seed 'a' not twice
    assert fl.vocab == {"root.seg": ("x", "y"), "orders.status": ("a",)}
    got = F.flatten(spec, table, fl)
    assert got.dtype == np.float64 and got.shape == (3, len(NAMES))
    np.testing.assert_array_equal(got, EXPECTED)


def test_a_branch_without_its_time_column_in_its_rows_is_cut_by_preprocess_only():
    """Where the time column is not in a branch's rows (the spec does not list it) the features
    cannot cut them: here the line of 2024-01-20 counts, as preprocess would have dropped it.
    ``last`` is then the last line in the branch's order."""
    spec, table = _spec(), _nested()
    d = spec.model_dump(by_alias=True)
    d["schema"]["branches"][0]["branches"][0]["columns"] = {"qty": "numeric"}
    spec = parse_spec(d)
    line = pa.struct([("qty", pa.float64())])
    order = pa.struct([*(ORDER.field(i) for i in range(3)), pa.field("lines", pa.list_(line))])
    rows = table["orders"].to_pylist()
    for order_rows in rows:
        for o in order_rows or []:
            o["lines"] = [{"qty": ln["qty"]} for ln in o["lines"]]
    table = table.set_column(table.schema.get_field_index("orders"), "orders", pa.array(rows, pa.list_(order)))
    fl = F.fit(spec, table)
    row = dict(zip(fl.names, F.flatten(spec, table, fl)[0], strict=True))
    # the first visible order's two lines; the post-seed order (o_t is a column) with its line is out
    assert row["lines.count"] == 2.0 and row["lines.qty.last"] == 100.0 and row["lines.qty.mean"] == 50.5
    assert row["orders.count"] == 2.0


def _flat_tables() -> dict[str, pa.Table]:
    """The same rows as ``_nested`` as the source tables they would come from."""
    users = pa.table(
        {
            "rid": pa.array([1, 2, 3], pa.int64()),
            "uid": pa.array([7, 8, 9], pa.int64()),
            "seed": pa.array([SEED] * 3, pa.timestamp("us")),
            "age": pa.array([30.0, 40.0, None]),
            "seg": pa.array(["x", "y", "z"]),
            "joined": pa.array([date(2024, 1, 1), None, date(2023, 12, 31)], pa.date32()),
            "y": pa.array([1, 0, 1], pa.int32()),
        }
    )
    orders = pa.table(
        {
            "o_id": pa.array([100, 101, 102], pa.int64()),
            "o_user": pa.array([7, 7, 7], pa.int64()),
            "o_t": pa.array([datetime(2024, 1, 5), datetime(2024, 1, 8), datetime(2024, 1, 15)], pa.timestamp("us")),
            "amount": pa.array([10.0, None, 1000.0]),
            "status": pa.array(["a", None, "a"]),
        }
    )
    lines = pa.table(
        {
            "l_order": pa.array([100, 100, 102], pa.int64()),
            "l_t": pa.array([datetime(2024, 1, 6), datetime(2024, 1, 20), datetime(2024, 1, 9)], pa.timestamp("ns")),
            "qty": pa.array([1.0, 100.0, 7.0]),
        }
    )
    return {"users": users, "orders": orders, "lines": lines}


def test_through_the_harness_preprocess_the_features_are_the_same(write_tables):
    """The real path: flat tables -> retrieve -> preprocess (its as-of cut drops the post-seed
    rows before any feature sees them) -> flatten; the features' own cut then finds nothing."""
    import numpy as np

    from tasks.sources.files import resolve_sources
    from tasks.stages.preprocess import preprocess
    from tasks.stages.retrieve import list_root_keys, retrieve
    from tasks.stages.split import with_train

    spec = _spec()
    sources = resolve_sources(spec, write_tables(_flat_tables()))
    keys, _ = list_root_keys(spec, sources)
    pre = preprocess(spec, retrieve(spec, sources, np.asarray(keys)))
    assert pre.child_rows == {"orders": 2, "lines": 1}  # the as-of cut, before any feature
    table = with_train(pre.table, [True, True, False], "rid")  # the hand-made table's split
    fl = F.fit(spec, table)
    assert fl.names == NAMES and fl.vocab == {"root.seg": ("x", "y"), "orders.status": ("a",)}
    np.testing.assert_array_equal(F.flatten(spec, table, fl), EXPECTED)


def test_the_flattening_round_trips_through_json():
    spec, table = _spec(), _nested()
    fl = F.fit(spec, table)
    assert F.Flattening.from_json(fl.to_json()) == fl


@pytest.mark.parametrize("rows", [0, 1])
def test_a_chunk_of_few_rows_gets_the_fitted_columns(rows):
    spec, table = _spec(), _nested()
    fl = F.fit(spec, table)
    got = F.flatten(spec, table.slice(0, rows), fl)
    assert got.shape == (rows, len(NAMES))
    np.testing.assert_array_equal(got, EXPECTED[:rows])
