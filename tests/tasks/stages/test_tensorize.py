"""tensorize and fit (tasks/stages/tensorize.py) without Prefect.

The hand-made shop workload (tables in tests/conftest.py):
customers (root) -> orders (max_length 2, by o_date) -> lines (max_length 3, by l_no):
customer 1 has 3 orders (10, 11, 12), customer 3 none; order 10 has 4 lines, order 12 two.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

from model.schema import NULL_INDEX, UNKNOWN_INDEX
from tasks.stages import split
from tasks.stages.preprocess import Preprocessed, preprocess
from tasks.stages.retrieve import ROOT
from tasks.stages.tensorize import fit, tensorize
from tests.tasks.stages.conftest import retrieved_of, spec_of

# --- helpers ---------------------------------------------------------------------------


def with_train(pre: Preprocessed, train: list[bool]) -> Preprocessed:
    """The same rows with a chosen train/validation split."""
    return dataclasses.replace(pre, table=split.with_train(pre.table, train, pre.table.column_names[0]))


# --- tensorize ---------------------------------------------------------------------------


def test_present_masks_are_prefixes(shop_spec, pre):
    spec = spec_of(shop_spec)
    enc, schema = fit(spec, pre)
    tz = tensorize(spec, pre, enc, schema)
    nodes = tz.batch.nodes
    assert nodes[ROOT].present.tolist() == [True] * 5
    assert nodes["orders"].present.int().tolist() == [[1, 1], [1, 0], [0, 0], [1, 1], [1, 0]]
    assert nodes["lines"].present.int().tolist() == [
        [[1, 1, 1], [1, 0, 0]],
        [[1, 0, 0], [0, 0, 0]],
        [[0, 0, 0], [0, 0, 0]],
        [[1, 1, 0], [0, 0, 0]],
        [[0, 0, 0], [0, 0, 0]],
    ]
    for node in ("orders", "lines"):
        p = nodes[node].present.int()
        assert (p[..., 1:] <= p[..., :-1]).all(), "present rows are a prefix"
    # a line can only be present under a present order
    assert not (nodes["lines"].present & ~nodes["orders"].present.unsqueeze(-1)).any()
    assert tz.keys.to_pylist() == [1, 2, 3, 4, 5]
    assert tz.root_rows == 5


def test_coordinate_counts_match_a_hand_count(shop_spec, pre):
    spec = spec_of(shop_spec)
    enc, schema = fit(spec, pre)
    tz = tensorize(spec, pre, enc, schema)
    # cells per row: root 3 inputs + the target = 4, orders 3, lines 2
    # reserved: 5*4 + 5*2*3 + 5*2*3*2 = 20 + 30 + 60
    # present: 5 roots * 4 + 6 orders * 3 + 7 lines * 2 = 20 + 18 + 14
    assert (tz.coords_present, tz.coords_reserved) == (52, 110)


def test_null_masks_and_zero_values(shop_spec, pre):
    spec = spec_of(shop_spec)
    enc, schema = fit(spec, pre)
    tz = tensorize(spec, pre, enc, schema)
    nodes = tz.batch.nodes
    root_cols = [c.name for c in schema.root.continuous]
    assert root_cols == ["c_balance", "c_since", "churn"]
    null = nodes[ROOT].continuous_null
    assert null[:, 0].tolist() == [False, True, False, False, False]  # c_balance
    assert null[:, 1].tolist() == [False, False, True, False, False]  # c_since
    assert not null[:, 2].any()  # the target cell is a learned mask, never null
    assert (nodes[ROOT].continuous[null] == 0).all()
    orders_cols = [c.name for c in schema.nodes["orders"].continuous]
    assert orders_cols == ["o_date", "o_total"]
    assert nodes["orders"].continuous_null.nonzero().tolist() == [[1, 0, 0]]  # order 20's date
    assert nodes["lines"].continuous_null.nonzero().tolist() == [[0, 0, 2, 0]]  # l_qty of 10/3
    assert nodes["lines"].continuous[0, 0, 2, 0].item() == 0.0
    # padding is neither present nor null
    assert not nodes["orders"].continuous_null[2].any()


def test_categories_unknown_and_null(shop_spec, pre):
    spec = spec_of(shop_spec)
    # customer 5 ('c', order status 'new') is held out, so its values are unseen at fit time
    held = with_train(pre, [True, True, True, True, False])
    enc, schema = fit(spec, held)
    assert enc.vocab["root.c_segment"] == ["a", "b"]
    assert enc.vocab["orders.o_status"] == ["done", "open"]
    tz = tensorize(spec, held, enc, schema)
    seg = tz.batch.nodes[ROOT].categorical[:, 0].tolist()
    assert seg == [2, 3, NULL_INDEX, 2, UNKNOWN_INDEX]  # a, b, null, a, c (unseen)
    status = tz.batch.nodes["orders"].categorical[..., 0].tolist()
    assert status == [[3, 2], [NULL_INDEX, 0], [0, 0], [3, 2], [UNKNOWN_INDEX, 0]]
    assert schema.nodes[ROOT].categorical[0].cardinality == 2 + 2  # vocab + null + unknown
    assert enc.classes == ["no", "yes"]
    assert tz.batch.labels.tolist() == [1, 0, 0, 1, 0]
    assert tz.batch.label_present.all()
    assert tz.is_train.tolist() == [True, True, True, True, False]


def test_standardisation_is_fitted_on_training_rows_only(shop_spec, pre):
    spec = spec_of(shop_spec)
    held = with_train(pre, [True, True, False, True, False])  # customers 3 and 5 held out
    enc, schema = fit(spec, held)
    # c_balance of the training rows: 10, null, 40 -> mean 25, std 15
    assert enc.mean["root.c_balance"] == pytest.approx(25.0)
    assert enc.std["root.c_balance"] == pytest.approx(15.0)
    # c_since in days since the epoch, training rows only
    days = [(dt.date(*d) - dt.date(1970, 1, 1)).days for d in ((2020, 1, 1), (2021, 6, 1), (2019, 3, 3))]
    assert enc.mean["root.c_since"] == pytest.approx(np.mean(days))
    assert enc.std["root.c_since"] == pytest.approx(np.std(days))
    # branch columns: the kept orders of customers 1, 2, 4 (decimal totals)
    totals = [100.50, 200.00, 50.25, 20.00, 10.00]
    assert enc.mean["orders.o_total"] == pytest.approx(np.mean(totals))
    tz = tensorize(spec, held, enc, schema)
    cont = tz.batch.nodes[ROOT].continuous
    assert cont[:, 0].tolist() == pytest.approx([-1.0, 0.0, 1 / 3, 1.0, 5 / 3])
    assert tz.batch.nodes["orders"].continuous[4, 0, 1].item() == pytest.approx(
        (5.0 - np.mean(totals)) / np.std(totals), rel=1e-5
    )


def test_sub_second_and_nanosecond_timestamps(shop_spec, shop_tables):
    orders = shop_tables["orders"]
    ns = pa.array(
        [None if v is None else v + dt.timedelta(microseconds=123_456) for v in orders["o_date"].to_pylist()],
        pa.timestamp("us"),
    ).cast(pa.timestamp("ns"))
    tables = dict(shop_tables, orders=orders.set_column(orders.schema.get_field_index("o_date"), "o_date", ns))
    spec = spec_of(shop_spec)
    pre = preprocess(spec, retrieved_of(tables))
    enc, schema = fit(spec, pre)
    kept = [
        dt.datetime(2024, m, d, h) + dt.timedelta(microseconds=123_456)
        for m, d, h in ((1, 1, 10), (2, 1, 10), (1, 10, 8), (1, 15, 8), (5, 5, 12))
    ]
    days = [(t - dt.datetime(1970, 1, 1)).total_seconds() / 86_400 for t in kept]
    assert enc.mean["orders.o_date"] == pytest.approx(np.mean(days), abs=1e-6)
    tz = tensorize(spec, pre, enc, schema)
    assert tz.batch.nodes["orders"].continuous_null[..., 0].nonzero().tolist() == [[1, 0]]


def test_integers_beyond_2_53_are_standardised_rounded_not_refused(shop_spec, shop_tables_big_ints):
    """A checked cast to float64 refused the whole column (ArrowInvalid: 'not in range')."""
    spec = spec_of(shop_spec)
    pre = preprocess(spec, retrieved_of(shop_tables_big_ints))
    enc, schema = fit(spec, pre)
    assert enc.mean["root.c_balance"] == pytest.approx(np.mean([2.0**62, 3.0, 2.0**53, -(2.0**60)]))
    tz = tensorize(spec, pre, enc, schema)
    assert tz.batch.nodes["root"].continuous_null[:, 0].tolist() == [False, True, False, False, False]


def test_regression_and_binary_targets(shop_spec, shop_tables):
    tables = dict(shop_tables)
    cust = tables["customers"]
    tables["customers"] = cust.append_column("spend", pa.array([1.0, 2.0, None, 4.0, 5.0])).append_column(
        "vip", pa.array([True, False, None, True, False])
    )
    shop_spec["task"] = {"target": "spend", "kind": "regression"}
    spec = spec_of(shop_spec)
    pre = preprocess(spec, retrieved_of(tables))
    enc, schema = fit(spec, pre)
    assert enc.target_mean == pytest.approx(3.0)
    tz = tensorize(spec, pre, enc, schema)
    assert tz.batch.label_present.tolist() == [True, True, False, True, True]
    assert tz.batch.labels[0].item() == pytest.approx((1.0 - 3.0) / enc.target_std)

    shop_spec["task"] = {"target": "vip", "kind": "binary"}
    spec = spec_of(shop_spec)
    pre = preprocess(spec, retrieved_of(tables))
    enc, schema = fit(spec, pre)
    tz = tensorize(spec, pre, enc, schema)
    assert tz.batch.labels.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert tz.batch.label_present.tolist() == [True, True, False, True, True]
