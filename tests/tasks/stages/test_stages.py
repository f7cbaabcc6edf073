"""Stage functions without Prefect, on the hand-made shop workload (see conftest).

customers (root) -> orders (max_length 2, by o_date) -> lines (max_length 3, by l_no):
customer 1 has 3 orders (10, 11, 12), customer 3 none; order 10 has 4 lines, order 12 two.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
from decimal import Decimal
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from model.schema import NULL_INDEX, UNKNOWN_INDEX
from tasks.measure.quality import Quality
from tasks.runtime.errors import UserError
from tasks.sources.files import SourceTable, check_sources, resolve_sources
from tasks.spec import Spec, parse_spec
from tasks.stages.compute import PredictOutputs
from tasks.stages.preprocess import TRAIN, Preprocessed, preprocess, split_is_train
from tasks.stages.retrieve import ROOT, Retrieved, list_root_keys, node_columns, read_rows, retrieve
from tasks.stages.tensorize import fit, tensorize
from tasks.stages.write import PredictionWriter, to_table

# --- helpers ---------------------------------------------------------------------------


def spec_of(raw: dict) -> Spec:
    return parse_spec(raw, "(test)")


def orders_branch(raw: dict) -> dict:
    return raw["schema"]["branches"][0]


def lines_branch(raw: dict) -> dict:
    return raw["schema"]["branches"][0]["branches"][0]


def retrieved_of(tables: dict[str, pa.Table]) -> Retrieved:
    """The whole shop as one chunk, straight from memory (no files)."""
    return Retrieved(
        {ROOT: tables["customers"], "orders": tables["orders"], "lines": tables["lines"]},
        bytes_read=0,
        root_rows=tables["customers"].num_rows,
    )


def rows_by_key(pre: Preprocessed) -> dict[int, dict]:
    return {r["c_id"]: r for r in pre.table.to_pylist()}


def order_totals(row: dict) -> list:
    return [o["o_total"] for o in row["orders"] or []]


def line_qtys(row: dict) -> list[list]:
    return [[line["l_qty"] for line in o["lines"] or []] for o in row["orders"] or []]


def with_train(pre: Preprocessed, train: list[bool]) -> Preprocessed:
    """The same rows with a chosen train/validation split."""
    idx = pre.table.schema.get_field_index(TRAIN)
    table = pre.table.set_column(idx, TRAIN, pa.array(train, pa.bool_()))
    return dataclasses.replace(pre, table=table)


def normalised(table: pa.Table, keys: list[str]) -> list[dict]:
    """Rows with numbers as float and text as str, sorted: comparable across formats."""
    df = pl.from_arrow(table)
    df = df.with_columns(
        [pl.col(c).cast(pl.Float64) for c, t in df.schema.items() if t.is_numeric()]
        + [pl.col(c).cast(pl.String) for c, t in df.schema.items() if t == pl.String]
    )
    return df.sort(keys).to_dicts()


@pytest.fixture
def pre(shop_spec, shop_tables) -> Preprocessed:
    return preprocess(spec_of(shop_spec), retrieved_of(shop_tables))


# --- retrieve ----------------------------------------------------------------------------


def test_retrieve_reads_only_the_needed_columns(write_tables, shop_tables, shop_spec, tmp_path):
    tables = dict(shop_tables)
    tables["customers"] = tables["customers"].append_column("c_notes", pa.array(["unused " * 50] * 5))
    write_tables(tables)
    spec = spec_of(shop_spec)
    sources = resolve_sources(spec, tmp_path)
    check_sources(spec, sources)
    keys, _ = list_root_keys(spec, sources)
    got = retrieve(spec, sources, keys)
    assert {k: t.column_names for k, t in got.tables.items()} == {
        ROOT: ["c_id", "c_balance", "c_segment", "c_since", "churn"],
        "orders": ["o_cust", "o_id", "o_date", "o_total", "o_status"],
        "lines": ["l_order", "l_no", "l_qty", "l_flag"],
    }
    assert node_columns(spec)[ROOT] == got.tables[ROOT].column_names
    assert got.root_rows == 5
    assert got.rows_read == {ROOT: 5, "orders": 7, "lines": 10}  # orphans (key 99) not read


def test_parquet_bytes_read_counts_only_projected_columns(tmp_path):
    wide = pa.table(
        {
            "c_id": pa.array(range(1000), pa.int64()),
            "c_balance": pa.array(np.arange(1000, dtype=np.float64)),
            "blob": pa.array([f"{i:08d}" * 64 for i in range(1000)]),
        }
    )
    path = tmp_path / "customers.parquet"
    pq.write_table(wide, path, compression="none")
    src = SourceTable("customers", (path,), "parquet")
    keys = pa.array(np.arange(1000), pa.int64())
    table, projected = read_rows(src, ["c_id", "c_balance"], "c_id", keys)
    _, everything = read_rows(src, ["c_id", "c_balance", "blob"], "c_id", keys)
    assert table.num_rows == 1000 and table.column_names == ["c_id", "c_balance"]
    assert 0 < projected < path.stat().st_size
    assert projected < everything
    assert projected < everything / 10  # the blob column dominates the file


def test_parquet_row_groups_outside_the_chunk_are_skipped(tmp_path):
    n = 10_000
    table = pa.table({"k": pa.array(np.arange(n), pa.int64()), "v": pa.array(np.arange(n, dtype=np.float64))})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=1000)
    src = SourceTable("t", (path,), "parquet")
    got, one_chunk = read_rows(src, ["k", "v"], "k", pa.array([5, 6, 7], pa.int64()))
    assert got["k"].to_pylist() == [5, 6, 7]
    _, all_chunks = read_rows(src, ["k", "v"], "k", pa.array(np.arange(n), pa.int64()))
    assert 0 < one_chunk * 5 < all_chunks  # one row group of ten


def test_parquet_ipc_and_csv_give_the_same_rows(tmp_path, write_tables, shop_tables, shop_spec):
    got = {}
    for fmt, suffix in (("parquet", "parquet"), ("ipc", "arrow"), ("csv", "csv")):
        folder = write_tables(shop_tables, fmt, tmp_path / fmt)
        shop_spec["source"]["tables"] = {t: f"{t}.{suffix}" for t in shop_tables}
        spec = spec_of(shop_spec)
        sources = resolve_sources(spec, folder)
        assert {s.format for s in sources.values()} == {fmt}
        check_sources(spec, sources)
        keys, nbytes = list_root_keys(spec, sources)
        assert keys.tolist() == [1, 2, 3, 4, 5] and nbytes > 0
        r = retrieve(spec, sources, keys)
        assert r.bytes_read > 0
        got[fmt] = {
            ROOT: normalised(r.tables[ROOT], ["c_id"]),
            "orders": normalised(r.tables["orders"], ["o_id"]),
            "lines": normalised(r.tables["lines"], ["l_order", "l_no"]),
        }
    assert got["parquet"] == got["ipc"] == got["csv"]
    assert got["parquet"]["orders"][0]["o_total"] == pytest.approx(100.5)


def test_retrieve_selects_a_chunk_top_down(shop_files, shop_spec):
    spec = spec_of(shop_spec)
    sources = resolve_sources(spec, shop_files)
    got = retrieve(spec, sources, np.array([1, 4]))
    assert sorted(got.tables[ROOT]["c_id"].to_pylist()) == [1, 4]
    assert sorted(got.tables["orders"]["o_id"].to_pylist()) == [10, 11, 12, 40, 41]
    # every line under those orders (overflow is preprocess's business, not retrieve's)
    assert sorted(got.tables["lines"]["l_order"].to_pylist()) == [10, 10, 10, 10, 11, 12, 12, 41, 41]


def test_a_chunks_tables_and_flat_rows_are_freed_when_dropped_not_kept_by_a_reference_cycle(shop_files, shop_spec):
    """retrieve, preprocess and flatten walked the branches with recursive closures, which put
    the chunk's tables (frames, flat rows) in reference cycles: alive until the cyclic garbage collector ran,
    579 MB of Arrow memory after 12 reads at scale 0.1. With the collector off, dropping the
    result must free them."""
    import gc
    import weakref

    from model.arrow import flatten
    from tasks.stages.preprocess import preprocess
    from tasks.stages.tensorize import layout

    spec = spec_of(shop_spec)
    sources = resolve_sources(spec, shop_files)
    pre = preprocess(spec, retrieve(spec, sources, np.array([1, 4])))
    gc.collect()
    gc.disable()
    try:
        got = retrieve(spec, sources, np.array([1, 4]))
        tables = [weakref.ref(t) for t in got.tables.values()]
        assert len(tables) == 3
        del got
        assert [t() for t in tables] == [None, None, None]
        # preprocess's frames are zero-copy views of those tables: their Arrow memory too
        base = pa.total_allocated_bytes()
        got = retrieve(spec, sources, np.array([1, 4]))
        assert pa.total_allocated_bytes() > base
        done = preprocess(spec, got)
        del got, done
        assert pa.total_allocated_bytes() == base
        rows = flatten(pre.table, layout(spec))
        assert list(rows) == [ROOT, "orders", "lines"]  # parents first
        flat = [weakref.ref(r) for r in rows.values()]
        del rows
        assert [r() for r in flat] == [None, None, None]
    finally:
        gc.enable()


def test_a_row_group_every_row_of_which_is_wanted_is_kept_without_a_copy():
    from tasks.stages.retrieve import _kept

    t = pa.table({"k": pa.array([1, 2, None, 4]), "v": ["a", "b", "c", "d"]})
    whole = t.slice(0, 2)
    two_chunks = pa.concat_tables([t.slice(3, 1), t.slice(0, 1)])  # keys 4, 1 in two chunks
    empty = t.slice(0, 0)
    got = _kept([whole, t, empty, two_chunks], "k", pa.array([1, 2, 4]))
    assert got[0] is whole and got[2] is empty and got[3] is two_chunks  # nothing dropped: no copy
    # an orphan (key not wanted) and a null key are dropped
    assert got[1].column("v").to_pylist() == ["a", "b", "d"]
    assert [p.column("v").to_pylist() for p in _kept([whole, t], "k", pa.array([4]))] == [[], ["d"]]
    assert _kept([], "k", pa.array([1])) == []


def test_the_wanted_keys_are_hashed_once_per_table_not_once_per_row_group(tmp_path, monkeypatch):
    """Arrow's ``is_in`` builds a hash set of the wanted keys on every call; once per row group
    that build was most of retrieve at scale 0.1 (8 builds of 150,000 keys per chunk)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from tasks.stages.retrieve import read_rows

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"k": list(range(40)), "v": [f"v{i}" for i in range(40)]}), path, row_group_size=10)
    calls = []
    real = pc.is_in
    monkeypatch.setattr(pc, "is_in", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    wanted = pa.array([3, 15, 16, 27, 39, 99])
    table, nbytes = read_rows(SourceTable("t", (path,), "parquet"), ["k", "v"], "k", wanted)
    assert calls == [1]  # four row groups overlap the keys' range: one hash build
    assert table["k"].to_pylist() == [3, 15, 16, 27, 39] and nbytes > 0

    # what is held unfiltered is bounded: past PENDING_BYTES the held row groups are filtered
    monkeypatch.setattr("tasks.stages.retrieve.PENDING_BYTES", 1)
    calls.clear()
    bounded, same_bytes = read_rows(SourceTable("t", (path,), "parquet"), ["k", "v"], "k", wanted)
    assert calls == [1, 1, 1, 1] and bounded.equals(table) and same_bytes == nbytes


def test_parquet_category_text_is_read_dictionary_encoded_and_a_few_rows_decoded(tmp_path):
    """Category text columns arrive as one dictionary (row groups' dictionaries unified), the
    same values as a plain read; a chunk with fewer rows than dictionary values (a request)
    gets plain strings, and so do columns that are not categories."""
    n = 4000
    words = np.array(["red", "green", "blue", "cyan", "plum"])
    colour = pa.array(words[np.arange(n) % 5], mask=np.arange(n) % 7 == 0)
    # the last row group holds values the others lack: each row group has its own dictionary
    colour = pa.concat_arrays([colour.slice(0, n - 1000), pa.array(["teal", "gold"] * 500)])
    table = pa.table({"k": np.arange(n), "colour": colour, "note": colour})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=1000)
    src = SourceTable("t", (path,), "parquet")
    every = pa.array(np.arange(n))
    got, _ = read_rows(src, ["k", "colour", "note"], "k", every, categories=["colour"])
    col = got["colour"]
    assert pa.types.is_dictionary(col.type) and col.num_chunks == 1
    assert sorted(col.chunk(0).dictionary.to_pylist()) == sorted({*words, "teal", "gold"})
    assert col.to_pylist() == table["colour"].to_pylist()  # nulls where they were
    assert got["note"].type == pa.string()
    few, _ = read_rows(src, ["k", "colour"], "k", pa.array([3, 3001]), categories=["colour"])
    assert few["colour"].type == pa.string() and few["colour"].to_pylist() == ["cyan", "gold"]
    plain, _ = read_rows(src, ["k", "colour"], "k", every)  # no categories named: as stored
    assert plain["colour"].type == pa.string()


def test_list_root_keys_sorts_and_collapses_duplicates(tmp_path, shop_spec, shop_tables, write_tables):
    tables = dict(shop_tables)
    cust = tables["customers"]
    tables["customers"] = pa.concat_tables([cust.slice(3), cust, cust.slice(0, 2)])
    write_tables(tables)
    spec = spec_of(shop_spec)
    keys, _ = list_root_keys(spec, resolve_sources(spec, tmp_path))
    assert keys.tolist() == [1, 2, 3, 4, 5]


# --- sources: the up-front checks ------------------------------------------------------


@pytest.mark.parametrize("fmt", ["parquet", "ipc", "csv"])
def test_an_empty_table_is_named(tmp_path, write_tables, shop_tables, shop_spec, fmt):
    tables = dict(shop_tables, lines=shop_tables["lines"].slice(0, 0))
    write_tables(tables, fmt)
    suffix = {"parquet": "parquet", "ipc": "arrow", "csv": "csv"}[fmt]
    shop_spec["source"]["tables"] = {t: f"{t}.{suffix}" for t in tables}
    spec = spec_of(shop_spec)
    # (a header-only CSV has no column types: emptiness must be reported, not a type clash)
    with pytest.raises(UserError, match=r"Table 'lines' \(.*lines\.\w+\) is empty"):
        check_sources(spec, resolve_sources(spec, tmp_path))


def test_a_zero_byte_csv_is_an_empty_table(tmp_path, write_tables, shop_tables, shop_spec):
    write_tables(shop_tables, "csv")
    (tmp_path / "lines.csv").write_text("")
    shop_spec["source"]["tables"] = {t: f"{t}.csv" for t in shop_tables}
    spec = spec_of(shop_spec)
    with pytest.raises(UserError, match="Table 'lines'.*is empty"):
        check_sources(spec, resolve_sources(spec, tmp_path))


@pytest.mark.parametrize(
    ("edit", "names"),
    [
        (
            lambda r: r["schema"]["root"]["columns"].update(c_nope="numeric"),
            ["Column 'c_nope'", "table 'customers'", "c_balance"],
        ),
        (lambda r: lines_branch(r).update(parent_key="l_parent"), ["'l_parent'", "parent_key", "'lines'"]),
        (lambda r: orders_branch(r).update(order_by={"column": "o_when"}), ["'o_when'", "order_by"]),
        (
            lambda r: r["schema"]["root"]["columns"].update(c_segment="numeric"),
            ["'c_segment'", "cannot be read as 'numeric'"],
        ),
        (lambda r: r["task"].update(target="churn", kind="regression"), ["task.target 'churn'", "numeric"]),
        (
            lambda r: r["source"]["tables"].update(orders="missing.parquet"),
            ["Table 'orders'", "missing.parquet", "does not exist"],
        ),
        (lambda r: r["source"]["tables"].update(orders="orders.txt"), ["Table 'orders'", "orders.txt"]),
    ],
    ids=["root-column", "parent-key", "order-by", "kind", "regression-target", "missing-file", "suffix"],
)
def test_source_checks_name_the_culprit(shop_files, shop_spec, edit, names):
    (shop_files / "orders.txt").write_text("o_id\n1\n")
    edit(shop_spec)
    spec = spec_of(shop_spec)
    with pytest.raises(UserError) as info:
        check_sources(spec, resolve_sources(spec, shop_files))
    for part in names:
        assert part in str(info.value)


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


# --- write -------------------------------------------------------------------------------


def branch_target_spec(shop_spec: dict) -> Spec:
    raw = copy.deepcopy(shop_spec)
    del orders_branch(raw)["columns"]["o_status"]
    raw["task"] = {
        "target": "o_status",
        "branch": "orders",
        "kind": "category",
        "outputs": ["prediction", "leaf:lines", "topk:2", "branch_embedding:lines"],
    }
    return spec_of(raw)


def test_nested_outputs_hold_only_present_rows(shop_spec, shop_tables):
    spec = branch_target_spec(shop_spec)
    pre = preprocess(spec, retrieved_of(shop_tables))
    enc, schema = fit(spec, pre)
    assert enc.classes == ["done", "new", "open"]
    tz = tensorize(spec, pre, enc, schema)
    gen = torch.Generator().manual_seed(0)
    present = {k: v.present for k, v in tz.batch.nodes.items()}
    logits = torch.randn(5, 2, 3, generator=gen)
    leaf = torch.randn(5, 2, 3, 4, generator=gen)
    pooled = torch.randn(5, 2, 4, generator=gen)
    outs = PredictOutputs({"prediction": logits, "leaf:lines": leaf, "branch_embedding:lines": pooled}, present)
    table = to_table(spec, schema, enc, tz.keys, outs)
    assert table.column_names == [
        "c_id",
        "prediction",
        "leaf_lines",
        "top2_labels",
        "top2_scores",
        "branch_embedding_lines",
    ]
    assert table["c_id"].to_pylist() == [1, 2, 3, 4, 5]
    orders_p, lines_p = present["orders"], present["lines"]

    expected_pred, expected_leaf, expected_emb = [], [], []
    for b in range(5):
        preds, leaves, embs = [], [], []
        for o in range(2):
            if not orders_p[b, o]:
                continue
            preds.append(enc.classes[int(logits[b, o].argmax())])
            embs.append(pytest.approx(pooled[b, o].tolist()))
            leaves.append([pytest.approx(leaf[b, o, s].tolist()) for s in range(3) if lines_p[b, o, s]])
        expected_pred.append(preds)
        expected_leaf.append(leaves)
        expected_emb.append(embs)
    assert table["prediction"].to_pylist() == expected_pred
    assert table["leaf_lines"].to_pylist() == expected_leaf
    assert table["branch_embedding_lines"].to_pylist() == expected_emb
    assert [len(x) for x in table["prediction"].to_pylist()] == [2, 1, 0, 2, 1]
    assert [[len(o) for o in r] for r in table["leaf_lines"].to_pylist()] == [[3, 1], [1], [], [2, 0], [0]]
    top = table["top2_labels"].to_pylist()
    assert [[t[0] for t in r] for r in top] == expected_pred  # best label first
    scores = table["top2_scores"].to_pylist()
    assert all(s[0] >= s[1] for r in scores for s in r)


def test_root_outputs_are_flat(shop_spec, pre):
    shop_spec["task"]["outputs"] = ["prediction", "root_embedding"]
    spec = spec_of(shop_spec)
    enc, schema = fit(spec, pre)
    tz = tensorize(spec, pre, enc, schema)
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 3.0], [5.0, 4.0], [0.0, 0.5]])
    emb = torch.arange(15, dtype=torch.float32).reshape(5, 3)
    outs = PredictOutputs(
        {"prediction": logits, "root_embedding": emb}, {k: v.present for k, v in tz.batch.nodes.items()}
    )
    table = to_table(spec, schema, enc, tz.keys, outs)
    assert table["prediction"].to_pylist() == ["no", "yes", "yes", "no", "yes"]
    assert table["root_embedding"].to_pylist() == emb.tolist()


def test_regression_predictions_are_unscaled(shop_spec, shop_tables):
    tables = dict(shop_tables)
    tables["customers"] = tables["customers"].append_column("spend", pa.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    shop_spec["task"] = {"target": "spend", "kind": "regression"}
    spec = spec_of(shop_spec)
    pre = preprocess(spec, retrieved_of(tables))
    enc, schema = fit(spec, pre)
    tz = tensorize(spec, pre, enc, schema)
    outs = PredictOutputs({"prediction": tz.batch.labels.clone()}, {k: v.present for k, v in tz.batch.nodes.items()})
    table = to_table(spec, schema, enc, tz.keys, outs)
    assert table["prediction"].to_pylist() == pytest.approx([1.0, 2.0, 3.0, 4.0, 5.0])


def test_multi_dimensional_outputs_keep_their_shape():
    from tasks.stages.write import nest

    for shape in [(4,), (4, 3), (4, 3, 2), (4, 3, 2, 2)]:
        values = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        assert nest(values, []).to_pylist() == values.tolist()
    # [B=2, L=2] presence, 3 present rows with a [2, 2] output each
    mask = np.array([[True, True], [True, False]])
    values = np.arange(3 * 4, dtype=np.float32).reshape(3, 2, 2)
    assert nest(values, [mask]).to_pylist() == [values[:2].tolist(), values[2:].tolist()]


def test_writer_commits_atomically(tmp_path: Path):
    path = tmp_path / "out" / "preds.parquet"
    writer = PredictionWriter(path)
    writer.write(pa.table({"k": [1, 2], "prediction": ["a", "b"]}))
    assert not path.exists() and writer.tmp.exists()  # only the temp file so far
    writer.write(pa.table({"k": [3], "prediction": ["c"]}))
    size = writer.commit()
    assert size == path.stat().st_size > 0
    assert pq.read_table(path).to_pydict() == {"k": [1, 2, 3], "prediction": ["a", "b", "c"]}
    assert sorted(p.name for p in path.parent.iterdir()) == ["preds.parquet"]
    assert writer.rows == 3


def test_writer_abort_leaves_nothing(tmp_path: Path):
    path = tmp_path / "out" / "preds.parquet"
    writer = PredictionWriter(path)
    writer.write(pa.table({"k": [1, 2]}))
    writer.abort()
    assert not path.exists()
    assert list(path.parent.iterdir()) == []
    writer.abort()  # idempotent
    PredictionWriter(tmp_path / "never" / "p.parquet").abort()  # nothing written: no error
    with pytest.raises(RuntimeError):
        PredictionWriter(tmp_path / "empty.parquet").commit()


# --- quality -----------------------------------------------------------------------------


def test_category_accuracy_on_held_out_rows():
    q = Quality("category")
    logits = torch.tensor([[3.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    labels = torch.tensor([0, 1, 1, 2])
    q.add(logits, labels, torch.tensor([True, True, True, False]))  # last row not counted
    q.add(torch.tensor([[0.0, 5.0, 0.0]]), torch.tensor([1]), torch.tensor([True]))
    m = q.metrics()
    assert m["rows"] == 4
    assert m["accuracy"] == pytest.approx(3 / 4)
    assert m["majority_rate"] == pytest.approx(3 / 4)  # label 1 three times of four
    assert q.headline == "accuracy"


def test_binary_auc_against_a_hand_count():
    # positives score 0.35, 0.8; negatives 0.1, 0.4: 3 of 4 pairs ordered -> AUC 0.75
    logits = torch.logit(torch.tensor([0.1, 0.4, 0.35, 0.8]))
    labels = torch.tensor([0.0, 0.0, 1.0, 1.0])
    q = Quality("binary")
    q.add(logits, labels, torch.ones(4, dtype=torch.bool))
    m = q.metrics()
    assert m["auc"] == pytest.approx(0.75)
    assert m["accuracy"] == pytest.approx(3 / 4)  # 0.4 -> positive: wrong
    assert q.headline == "auc"
    # ties count one half
    q = Quality("binary")
    q.add(torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0.0, 1.0, 1.0]), torch.ones(3, dtype=torch.bool))
    assert q.metrics()["auc"] == pytest.approx((0.5 + 1.0) / 2)
    # one class only: undefined
    q = Quality("binary")
    q.add(torch.tensor([0.3]), torch.tensor([1.0]), torch.ones(1, dtype=torch.bool))
    assert np.isnan(q.metrics()["auc"])


def test_regression_errors_in_original_units():
    q = Quality("regression", target_mean=10.0, target_std=2.0)
    q.add(torch.tensor([0.0, 1.0, -1.0]), torch.tensor([0.5, 1.0, 0.0]), torch.ones(3, dtype=torch.bool))
    m = q.metrics()
    assert m["mae"] == pytest.approx((1.0 + 0.0 + 2.0) / 3)
    assert m["rmse"] == pytest.approx(np.sqrt((1.0 + 0.0 + 4.0) / 3))
    assert Quality("regression").metrics() == {}


def test_branch_target_quality_counts_present_rows_only():
    q = Quality("category")
    logits = torch.zeros(2, 2, 3)
    logits[..., 1] = 1.0  # predicts class 1 everywhere
    labels = torch.tensor([[1, 0], [2, 0]])
    mask = torch.tensor([[True, False], [True, False]])
    q.add(logits, labels, mask)
    assert q.metrics()["accuracy"] == pytest.approx(0.5)
