"""rel-tpch: the generated TPC-H as a RelBench folder, read by relbench 3.0.2's own classes.

TPC-H is generated at scale 0.01 into the test's own folder (``ensure_tpch(root=...)``) once
for the module; the folder is then read with ``relbench.load.RelBenchDataset``, no stub: its
key contract checked by ``get_db``, the seed times of every split, the stored labels against
RelBench's regeneration from the manifest SQL and against a Polars recomputation from the
original orders table, and a second call reusing the folder.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pytest

from tasks.datasets.relbench_tpch import (
    TASKS,
    TEST_TIMESTAMP,
    VAL_TIMESTAMP,
    ensure_rel_tpch,
    is_complete,
    rel_tpch_dir,
)
from tasks.datasets.tpch import ensure_tpch

pytestmark = pytest.mark.slow  # TPC-H generation and label SQL: about 5 s for the module

SPLITS = ("train", "val", "test")
WINDOW = dt.timedelta(days=90)


@pytest.fixture(scope="module")
def tpch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder, generated = ensure_tpch(0.01, tmp_path_factory.mktemp("rel-tpch"))
    assert generated
    return folder


@pytest.fixture(scope="module")
def rel(tpch: Path) -> Path:
    return ensure_rel_tpch(tpch)


@pytest.fixture(scope="module")
def dataset(rel: Path):
    from relbench.load import RelBenchDataset

    return RelBenchDataset(rel)


def test_the_folder_is_relbench_format_and_its_keys_follow_the_contract(rel, tpch, dataset):
    from relbench.manifest import validate_dataset_manifest

    assert rel == tpch / "rel-tpch" == rel_tpch_dir(tpch) and is_complete(rel)
    assert dataset.is_local and dataset.get_task_names() == sorted(TASKS)
    assert (dataset.manifest.name, dataset.manifest.val_timestamp, dataset.manifest.test_timestamp) == (
        "rel-tpch",
        VAL_TIMESTAMP,
        TEST_TIMESTAMP,
    )
    validate_dataset_manifest(dataset.manifest, rel / "db")
    spec = {t: (s.pkey, s.time_col, s.fkeys) for t, s in dataset.manifest.tables.items()}
    assert spec == {
        "customer": ("c_custkey", None, {}),
        "orders": ("o_orderkey", "o_orderdate", {"o_custkey": "customer"}),
        "lineitem": (None, "l_shipdate", {"l_orderkey": "orders"}),
    }
    full = dataset.get_db(upto_test_timestamp=False)  # RelBench's own check: pkeys 0..N-1 in row order
    cut = dataset.get_db()  # and still after the cut at test_timestamp (needs orders sorted by time)
    orders = full.table_dict["orders"].df
    assert str(orders["o_orderdate"].dtype) == "datetime64[ns]" and orders["o_orderdate"].is_monotonic_increasing
    assert orders["o_totalprice"].dtype == np.float64
    assert len(full.table_dict["customer"]) == 1500 and len(orders) == 15000
    assert len(cut.table_dict["orders"]) < len(orders)
    assert cut.table_dict["lineitem"].df["l_orderkey"].notna().all()  # no dangling line item after the cut
    # every column of the TPC-H tables is kept
    for t in ("customer", "orders", "lineitem"):
        assert list(full.table_dict[t].df.columns) == pl.read_parquet_schema(tpch / f"{t}.parquet").names()


def test_foreign_keys_point_at_the_same_rows_as_before(rel, tpch):
    orders = pl.read_parquet(tpch / "orders.parquet")
    lines = pl.read_parquet(tpch / "lineitem.parquet")
    new_orders = pl.read_parquet(rel / "db" / "orders.parquet")
    new_lines = pl.read_parquet(rel / "db" / "lineitem.parquet")
    cust_map = pl.read_parquet(rel / "keymap" / "customer.parquet")
    order_map = pl.read_parquet(rel / "keymap" / "orders.parquet")
    # map the new keys back and compare with TPC-H's rows, joined on their own keys
    back = (
        new_orders.join(order_map, on="o_orderkey")
        .join(cust_map.rename({"original": "cust_original", "c_custkey": "o_custkey"}), on="o_custkey")
        .select(pl.col("original").alias("o_orderkey"), pl.col("cust_original").alias("o_custkey"), "o_comment")
        .sort("o_orderkey")
    )
    assert back.equals(orders.select("o_orderkey", "o_custkey", "o_comment").sort("o_orderkey"))
    line_back = (
        new_lines.join(order_map.rename({"o_orderkey": "l_orderkey"}), on="l_orderkey")
        .select(pl.col("original").alias("l_orderkey"), "l_linenumber", "l_comment")
        .sort("l_orderkey", "l_linenumber")
    )
    assert line_back.equals(lines.select("l_orderkey", "l_linenumber", "l_comment").sort("l_orderkey", "l_linenumber"))


def test_seed_times_per_split_are_relbenchs(dataset):
    val, test = pd.Timestamp(VAL_TIMESTAMP), pd.Timestamp(TEST_TIMESTAMP)
    for name in TASKS:
        task = dataset.load_task(name)
        seeds = {s: sorted(task.get_table(s, mask_input_cols=False).df["timestamp"].unique()) for s in SPLITS}
        # train steps back from val_timestamp - 90 days by 90 days, to the first time in the database
        assert seeds["train"][-1] == val - WINDOW
        assert all(b - a == WINDOW for a, b in zip(seeds["train"], seeds["train"][1:], strict=False))
        assert seeds["train"][0] >= pd.Timestamp("1992-01-01") > seeds["train"][0] - WINDOW
        assert len(seeds["train"]) == 21
        assert seeds["val"] == [val] and seeds["test"] == [test]
        assert test + WINDOW < pd.Timestamp("1998-08-02")  # the test window ends before the last order


def test_stored_labels_are_relbenchs_regeneration_unmasked_and_sorted(rel, dataset):
    from relbench.base.task_base import label_sort_cols, sort_labels

    for name, t in TASKS.items():
        stored = dataset.load_task(name)
        fresh = dataset.load_task(name, regenerate=True)
        db = fresh.get_db(upto_test_timestamp=False)
        for split in SPLITS:
            got = stored.get_table(split, mask_input_cols=False).df
            want = fresh.get_table(split, mask_input_cols=False, db=db).df
            assert list(got.columns) == ["timestamp", "c_custkey", t["target_col"]]
            assert str(got["timestamp"].dtype) == "datetime64[ns]"  # one resolution in every split
            pd.testing.assert_frame_equal(got, want, check_dtype=False)
            pd.testing.assert_frame_equal(got, sort_labels(got.copy(), label_sort_cols(stored)))
        # test labels are stored in the clear, as hosted tasks store them; get_table masks them itself
        assert t["target_col"] not in stored.get_table("test").df.columns


def test_labels_match_a_polars_recomputation_from_the_tpch_orders(rel, tpch, dataset):
    orders = pl.read_parquet(tpch / "orders.parquet").with_columns(
        pl.col("o_orderdate").cast(pl.Datetime("ns")), pl.col("o_totalprice").cast(pl.Float64)
    )
    cust_map = pl.read_parquet(rel / "keymap" / "customer.parquet")
    # 100 customers; every third one never orders (TPC-H leaves them without orders)
    originals = list(range(1, 101))
    assert orders.filter(pl.col("o_custkey") == 3).is_empty()
    mine = orders.filter(pl.col("o_custkey").is_in(originals))
    for name, t in TASKS.items():
        for split in SPLITS:
            labels = pl.from_pandas(dataset.load_task(name).get_table(split, mask_input_cols=False).df)
            labels = labels.join(cust_map, on="c_custkey").filter(pl.col("original").is_in(originals))
            for seed in labels["timestamp"].unique().sort():
                active = mine.filter(pl.col("o_orderdate") <= seed)["o_custkey"].unique().sort().to_list()
                window = (
                    mine.filter((pl.col("o_orderdate") > seed) & (pl.col("o_orderdate") <= seed + WINDOW))
                    .group_by("o_custkey")
                    .agg(pl.col("o_totalprice").sum().alias("value"))
                )
                expect = dict(zip(window["o_custkey"].to_list(), window["value"].to_list(), strict=True))
                at = labels.filter(pl.col("timestamp") == seed).sort("original")
                assert at["original"].to_list() == active  # entities: customers with an order by the seed time
                for original, label in zip(at["original"], at[t["target_col"]], strict=True):
                    if t["task_type"] == "binary_classification":
                        assert label == int(original in expect), (name, split, seed, original)
                    else:
                        assert label == pytest.approx(expect.get(original, 0.0)), (name, split, seed, original)


def test_labels_are_not_degenerate_and_relbench_scores_them(dataset):
    churn = dataset.load_task("customer-churn")
    for split in SPLITS:
        rate = churn.get_table(split, mask_input_cols=False).df["orders_next_90d"].mean()
        assert 0.2 < rate < 0.8, (split, rate)
    value = dataset.load_task("customer-value")
    test = value.get_table("test", mask_input_cols=False).df
    assert 0.2 < (test["value_next_90d"] > 0).mean() < 0.8
    mean = value.get_table("train").df["value_next_90d"].mean()
    nmae = value.evaluate(np.full(len(test), mean))["nmae"]  # RelBench's own metric, no network
    assert 0.5 < nmae < 2.0
    auc = churn.evaluate(np.full(len(test), 0.5))["roc_auc"]
    assert auc == pytest.approx(0.5)


def test_a_second_call_reuses_the_folder_and_an_incomplete_one_is_rebuilt(rel, tpch):
    stamps = {p: p.stat().st_mtime_ns for p in rel.rglob("*") if p.is_file()}
    assert ensure_rel_tpch(tpch) == rel
    assert {p: p.stat().st_mtime_ns for p in rel.rglob("*") if p.is_file()} == stamps
    (rel / "tasks" / "customer-value" / "test.parquet").unlink()  # an interrupted copy by hand
    assert not is_complete(rel)
    assert ensure_rel_tpch(tpch) == rel and is_complete(rel)
    assert not [p for p in tpch.iterdir() if p.name.startswith(".rel-tpch-")]  # no temporary folder left
