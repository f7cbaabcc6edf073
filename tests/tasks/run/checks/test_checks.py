"""Data checks before any work (tasks/run/checks/data.py) on the hand-checkable shop tables.

Shop facts: customers 1..5; orders hang under 1, 1, 1, 2, 4, 4, 5 and an orphan 99
(customer 3 has none); lines hang under orders 10 (x4), 11, 12 (x2), 20, 41 (x2) and 99
(an order that exists, under the orphan customer); orders 40 and 50 have no lines.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.run.checks.data import (
    check_data,
    check_data_before_work,
    check_device_name,
    check_files,
    check_table_folders,
)
from tasks.runtime.errors import UserError
from tasks.sources.files import check_sources, resolve_sources
from tasks.spec import parse_spec


def _setup(shop_spec, tables, write_tables, tmp_path, **run):
    shop_spec["run"].update(run)
    folder = write_tables(tables)
    spec = parse_spec(shop_spec)
    sources = resolve_sources(spec, folder)
    check_sources(spec, sources)
    return spec, sources


def _predict(shop_spec):
    shop_spec["run"]["mode"] = "predict"  # the 5-row shop has no validation rows to train on
    return shop_spec


def test_counts_match_the_shop_tables(shop_spec, shop_tables, write_tables, tmp_path):
    spec, sources = _setup(_predict(shop_spec), shop_tables, write_tables, tmp_path)
    facts = check_data(spec, sources)
    m = facts.metrics
    assert m["data.duplicate_root_keys"] == 0
    assert m["data.orphan_rows.orders"] == 1 and m["data.roots_without_rows.orders"] == 1
    assert m["data.orphan_rows.lines"] == 0 and m["data.roots_without_rows.lines"] == 2
    assert facts.observed_max_rows == {"orders": 3, "lines": 4}
    assert m["data.non_finite.customers.c_balance"] == 0
    assert any("orders" in w and "no parent row" in w for w in facts.warnings)


def test_reserved_rows_never_exceed_the_observed_maximum(shop_spec, shop_tables, write_tables, tmp_path):
    shop_spec["schema"]["branches"][0]["max_length"] = 100_000
    spec, sources = _setup(_predict(shop_spec), shop_tables, write_tables, tmp_path)
    run_spec, metrics, _ = check_data_before_work(spec, sources)
    assert metrics["data.observed_max_rows.orders"] == 3
    assert metrics["data.reserved_rows.orders"] == 3  # not 100,000
    assert metrics["data.reserved_rows.lines"] == 3  # max_length 3 < observed 4: kept
    assert run_spec.schema_.branches[0].max_length == 3
    assert spec.schema_.branches[0].max_length == 100_000  # the configured value is untouched


def test_memory_budget_refuses_with_estimate_budget_and_keys(shop_spec, shop_tables, write_tables, tmp_path):
    spec, sources = _setup(_predict(shop_spec), shop_tables, write_tables, tmp_path, max_memory_bytes=1000)
    with pytest.raises(UserError) as err:
        check_data_before_work(spec, sources)
    msg = str(err.value)
    for part in (
        "47,310 bytes",
        "memory budget is 1,000 bytes",
        "run.max_memory_bytes",
        "run.chunk_rows",
        "run.batch_size",
        "orders.max_length (reserving 2)",
    ):
        assert part in msg, (part, msg)


def test_nan_is_a_counted_null_and_infinity_is_refused(shop_spec, shop_tables, write_tables, tmp_path):
    t = shop_tables["customers"]
    nan = t.set_column(1, "c_balance", pa.array([float("nan"), None, 30.0, float("nan"), 50.0]))
    spec, sources = _setup(_predict(shop_spec), {**shop_tables, "customers": nan}, write_tables, tmp_path)
    facts = check_data(spec, sources)
    assert facts.metrics["data.non_finite.customers.c_balance"] == 2
    assert any("NaN" in w for w in facts.warnings)

    inf = t.set_column(1, "c_balance", pa.array([float("inf"), None, -float("inf"), 1.0, 2.0]))
    spec, sources = _setup(shop_spec, {**shop_tables, "customers": inf}, write_tables, tmp_path)
    with pytest.raises(UserError, match=r"Column 'c_balance' of table 'customers' holds 2 infinite"):
        check_data(spec, sources)


@pytest.mark.parametrize("as_text", [str, lambda k: f"{k:08d}"])
def test_key_types_that_cannot_join_name_both_columns(shop_spec, shop_tables, write_tables, tmp_path, as_text):
    o = shop_tables["orders"]
    o = o.set_column(1, "o_cust", pa.array([as_text(k) for k in o["o_cust"].to_pylist()]))
    spec, sources = _setup(shop_spec, {**shop_tables, "orders": o}, write_tables, tmp_path)
    with pytest.raises(UserError) as err:
        check_data(spec, sources)
    msg = str(err.value)
    assert "'o_cust'" in msg and "'c_id'" in msg and "String" in msg and "Int64" in msg


def test_strings_that_join_nothing_are_refused(shop_spec, shop_tables, write_tables, tmp_path):
    c = shop_tables["customers"]
    c = c.set_column(0, "c_id", pa.array([f"{k:04d}" for k in c["c_id"].to_pylist()]))
    o = shop_tables["orders"]
    o = o.set_column(1, "o_cust", pa.array([str(k) for k in o["o_cust"].to_pylist()]))
    spec, sources = _setup(shop_spec, {**shop_tables, "customers": c, "orders": o}, write_tables, tmp_path)
    with pytest.raises(UserError, match=r"Branch 'orders': none of its 8 rows joins a parent"):
        check_data(spec, sources)


def test_duplicate_root_keys_are_counted_and_refused(shop_spec, shop_tables, write_tables, tmp_path):
    c = shop_tables["customers"]
    spec, sources = _setup(
        shop_spec, {**shop_tables, "customers": pa.concat_tables([c, c.slice(0, 2)])}, write_tables, tmp_path
    )
    with pytest.raises(UserError, match=r"2 duplicate root key rows in 'c_id' \(e.g. 1\)"):
        check_data(spec, sources)


@pytest.mark.parametrize("nulls", [2, 5])  # some, and all: all-null keys looked like 4 duplicates of None
def test_null_root_keys_are_refused_as_nulls_with_count_and_fix(nulls, shop_spec, shop_tables, write_tables, tmp_path):
    c = shop_tables["customers"]
    keys = pa.array([None] * nulls + list(range(1, 6 - nulls)), pa.int64())
    customers = c.set_column(c.schema.get_field_index("c_id"), "c_id", keys)
    spec, sources = _setup(_predict(shop_spec), {**shop_tables, "customers": customers}, write_tables, tmp_path)
    with pytest.raises(UserError) as err:
        check_data(spec, sources)
    msg = str(err.value)
    assert f"Table 'customers' has {nulls} of 5 rows with a null root key in 'c_id'" in msg
    assert "Drop or fill those rows" in msg and "duplicate" not in msg and "None" not in msg


def _target(values):
    return lambda t: t.set_column(4, "churn", pa.array(values, pa.string()))


@pytest.mark.parametrize(
    "values, expected",
    [
        ([None] * 5, "no labelled rows: all 5 are null"),
        (["yes"] * 5, "0 in the validation split"),  # the shop's 5 keys all hash to training
    ],
)
def test_degenerate_targets_are_refused_before_training(
    shop_spec, shop_tables, write_tables, tmp_path, values, expected
):
    c = _target(values)(shop_tables["customers"])
    spec, sources = _setup(shop_spec, {**shop_tables, "customers": c}, write_tables, tmp_path)
    with pytest.raises(UserError, match="task.target 'churn'") as err:
        check_data(spec, sources)
    assert expected in str(err.value)


def test_single_class_target_is_refused(shop_spec, shop_tables, write_tables, tmp_path):
    shop_spec["task"]["validation_fraction"] = 0.5
    c = shop_tables["customers"]
    c = pa.table(
        {
            "c_id": pa.array(range(1, 41), pa.int64()),
            "c_balance": pa.array([1.0] * 40),
            "c_segment": pa.array(["a"] * 40),
            "c_since": pa.array([None] * 40, pa.date32()),
            "churn": pa.array(["no"] * 40),
        }
    )
    spec, sources = _setup(shop_spec, {**shop_tables, "customers": c}, write_tables, tmp_path)
    with pytest.raises(UserError, match=r"single class \('no'\)"):
        check_data(spec, sources)


def test_folder_files_with_differing_schemas_name_files_and_column(shop_spec, shop_tables, write_tables, tmp_path):
    lines = shop_tables["lines"]
    folder = write_tables(shop_tables)
    (folder / "lines.parquet").unlink()
    (folder / "lines").mkdir()
    pq.write_table(lines.slice(0, 5), folder / "lines" / "a.parquet")
    b = lines.slice(5)
    pq.write_table(b.set_column(2, "l_qty", b["l_qty"].cast(pa.float32())), folder / "lines" / "b.parquet")
    shop_spec["source"]["tables"]["lines"] = "lines"
    spec = parse_spec(shop_spec)
    sources = resolve_sources(spec, folder)
    with pytest.raises(UserError) as err:
        check_files(spec, sources)
    msg = str(err.value)
    assert "'l_qty'" in msg and "a.parquet" in msg and "b.parquet" in msg and "float" in msg


def test_corrupt_parquet_names_table_and_file(shop_spec, shop_tables, write_tables, tmp_path):
    folder = write_tables(shop_tables)
    raw = (folder / "orders.parquet").read_bytes()
    (folder / "orders.parquet").write_bytes(raw[: len(raw) // 2])
    spec = parse_spec(shop_spec)
    sources = resolve_sources(spec, folder)
    with pytest.raises(UserError, match=r"Table 'orders': file '.*orders.parquet'"):
        check_files(spec, sources)


def test_folder_without_data_files_says_so(shop_spec, shop_tables, write_tables, tmp_path):
    folder = write_tables(shop_tables)
    (folder / "empty").mkdir()
    (folder / "empty" / "README.txt").write_text("x")
    shop_spec["source"]["tables"]["lines"] = "empty"
    with pytest.raises(UserError, match=r"Table 'lines': folder .* holds no data files .*README.txt"):
        check_table_folders(parse_spec(shop_spec), folder)


def test_device_name_is_checked(shop_spec):
    shop_spec["run"]["device"] = "banana"
    with pytest.raises(UserError, match=r"run.device 'banana' is not a device"):
        check_device_name(parse_spec(shop_spec))


def test_spec_file_that_is_not_utf8_is_named(tmp_path):
    from tasks.spec import load_spec

    path = tmp_path / "spec.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(UserError, match=r"is not UTF-8 text \(byte 0xe9 at offset 9\)"):
        load_spec(path)
