"""retrieve (tasks/stages/retrieve.py) without Prefect, and the up-front source checks it relies on.

The hand-made shop workload (tables in tests/conftest.py):
customers (root) -> orders (max_length 2, by o_date) -> lines (max_length 3, by l_no):
customer 1 has 3 orders (10, 11, 12), customer 3 none; order 10 has 4 lines, order 12 two.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.runtime.errors import UserError
from tasks.sources.files import SourceTable, check_sources, resolve_sources
from tasks.stages.retrieve import ROOT, list_root_keys, node_columns, read_rows, retrieve
from tests.tasks.stages.conftest import lines_branch, orders_branch, spec_of

# --- helpers ---------------------------------------------------------------------------


def normalised(table: pa.Table, keys: list[str]) -> list[dict]:
    """Rows with numbers as float and text as str, sorted: comparable across formats."""
    df = pl.from_arrow(table)
    df = df.with_columns(
        [pl.col(c).cast(pl.Float64) for c, t in df.schema.items() if t.is_numeric()]
        + [pl.col(c).cast(pl.String) for c, t in df.schema.items() if t == pl.String]
    )
    return df.sort(keys).to_dicts()


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


def test_a_null_typed_column_is_read_as_its_declared_kind(
    tmp_path, write_tables, shop_tables, shop_spec, prepare_chunk
):
    """pandas writes an all-None column with Arrow's null type: declared numeric (c_balance),
    timestamp (c_since) or category (c_segment), it failed the column check ("has type null");
    now every library's chain reads it as its kind, all null."""
    c = shop_tables["customers"]
    for name in ("c_balance", "c_since", "c_segment"):
        c = c.set_column(c.schema.get_field_index(name), name, pa.nulls(c.num_rows, pa.null()))
    folder = write_tables(dict(shop_tables, customers=c))
    assert pq.read_schema(folder / "customers.parquet").field("c_balance").type == pa.null()
    spec = spec_of(shop_spec)
    sources = resolve_sources(spec, folder)
    check_sources(spec, sources)  # raised UserError before
    keys, _ = list_root_keys(spec, sources)
    root = retrieve(spec, sources, keys).tables[ROOT]
    types = {n: str(root[n].type) for n in ("c_balance", "c_since", "c_segment")}
    assert types == {"c_balance": "double", "c_since": "timestamp[us]", "c_segment": "string"}
    assert root["c_balance"].null_count == root.num_rows
    _, _, _, tz = prepare_chunk(shop_spec, folder)  # tensorize takes them
    assert bool(tz.batch.nodes["root"].continuous_null[:, 0].all())


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
