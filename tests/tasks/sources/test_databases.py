"""Database sources: DuckDB and PostgreSQL reads equal the Parquet reads for the same keys
(types, nulls, nesting), and every bad input is a UserError with the URL masked and the fix."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tasks.runtime.errors import UserError
from tasks.sources import databases
from tasks.sources.files import check_sources, resolve_sources
from tasks.spec import parse_spec
from tasks.stages.retrieve import category_columns, list_root_keys, retrieve

SHOP_KEYS = {"customers": ("c_id",), "orders": ("o_id", "o_cust"), "lines": ("l_order",)}


@pytest.fixture(autouse=True)
def _close_connections():
    yield
    databases.close_all()


def _db_spec(shop_spec: dict, url: str):
    shop_spec["source"] = {"database": {"url": url}}
    return parse_spec(shop_spec)


def _sorted(t: pa.Table) -> pa.Table:
    return t.sort_by([(c, "ascending") for c in t.column_names])


def _decoded(t: pa.Table) -> pa.Table:
    """Dictionary columns as their values: Parquet category text is read dictionary-encoded
    (tasks/stages/retrieve.py), a database returns it plain; the values must be the same."""
    return t.cast(
        pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in t.schema])
    )


def _assert_same_reads(spec_files, files_dir: Path, spec_db, base: Path) -> None:
    files = resolve_sources(spec_files, files_dir)
    db = databases.resolve_database(spec_db, base, None)
    check_sources(spec_db, db)  # the same metadata checks pass on the database
    keys_f, _ = list_root_keys(spec_files, files)
    keys_d, nbytes = list_root_keys(spec_db, db)
    assert np.array_equal(keys_f, keys_d) and nbytes > 0
    for chosen in (keys_f, np.array([1]), np.array([3, 4])):  # chunk, request, no children
        a = retrieve(spec_files, files, chosen)
        b = retrieve(spec_db, db, chosen)
        assert a.rows_read == b.rows_read
        assert b.bytes_read > 0
        cats = category_columns(spec_files)
        for name in a.tables:
            dictionary = {f.name for f in a.tables[name].schema if pa.types.is_dictionary(f.type)}
            assert dictionary <= set(cats[name]), name  # only category columns, never keys or numbers
            assert b.tables[name].schema.equals(_decoded(a.tables[name]).schema), name
            assert _sorted(b.tables[name]).equals(_sorted(_decoded(a.tables[name]))), name


def test_duckdb_reads_equal_parquet(shop_spec, shop_files, tmp_path):
    db_file = tmp_path / "shop.duckdb"
    rows = databases.build_duckdb(shop_files, db_file, SHOP_KEYS)
    assert rows == {"customers": 5, "lines": 11, "orders": 8}
    spec_files = parse_spec(shop_spec)
    _assert_same_reads(spec_files, shop_files, _db_spec(shop_spec, f"duckdb:{db_file.name}"), tmp_path)


@pytest.mark.slow
def test_postgresql_reads_equal_parquet(postgres_server, shop_spec, shop_files, tmp_path):
    rows = databases.load_postgresql(postgres_server.dsn, shop_files, SHOP_KEYS)
    assert rows == {"customers": 5, "lines": 11, "orders": 8}
    spec_files = parse_spec(shop_spec)
    _assert_same_reads(spec_files, shop_files, _db_spec(shop_spec, postgres_server.dsn), tmp_path)


def test_missing_duckdb_file_names_the_fix(shop_spec, tmp_path):
    spec = _db_spec(shop_spec, "duckdb:nope.duckdb")
    with pytest.raises(UserError, match=r"nope.duckdb' does not exist.*--into duckdb"):
        databases.resolve_database(spec, tmp_path, None)


def test_missing_table_names_table_and_fix(shop_spec, shop_files, tmp_path):
    db_file = tmp_path / "part.duckdb"
    only = tmp_path / "only"
    only.mkdir()
    (shop_files / "customers.parquet").rename(only / "customers.parquet")
    databases.build_duckdb(only, db_file, SHOP_KEYS)
    spec = _db_spec(shop_spec, f"duckdb:{db_file}")
    with pytest.raises(UserError, match=r"Table 'orders' is not in database duckdb:.*--into"):
        databases.resolve_database(spec, tmp_path, None)


def test_bare_duckdb_needs_generated_data(shop_spec, tmp_path):
    with pytest.raises(UserError, match="no source.generate"):
        databases.resolve_database(_db_spec(shop_spec, "duckdb"), tmp_path, None)


def test_password_in_url_is_refused_and_masked(shop_spec):
    shop_spec["source"] = {"database": {"url": "postgresql://bob:hunter2@127.0.0.1:5432/db"}}
    with pytest.raises(UserError) as err:
        parse_spec(shop_spec)
    assert "hunter2" not in str(err.value)
    assert "postgresql://bob:***@127.0.0.1:5432/db" in str(err.value)
    assert "PGPASSWORD" in str(err.value)


def test_unknown_scheme_and_unset_variable(shop_spec, tmp_path, monkeypatch):
    with pytest.raises(UserError, match="not a supported database"):
        databases.resolve_database(_db_spec(shop_spec, "mysql://x/y"), tmp_path, None)
    monkeypatch.delenv("RELFLOW_NO_SUCH_VAR", raising=False)
    spec = _db_spec(shop_spec, "postgresql://bob@127.0.0.1:1/${RELFLOW_NO_SUCH_VAR}")
    with pytest.raises(UserError, match=r"RELFLOW_NO_SUCH_VAR.*not set"):
        databases.resolve_database(spec, tmp_path, None)


def test_connection_failure_masks_the_password_from_the_environment(shop_spec, tmp_path, monkeypatch):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RELFLOW_TEST_PW", "s3cret-from-env")
    spec = _db_spec(shop_spec, f"postgresql://bob:${{RELFLOW_TEST_PW}}@127.0.0.1:{port}/db")
    with pytest.raises(UserError) as err:
        databases.resolve_database(spec, tmp_path, None)
    msg = str(err.value)
    assert "s3cret-from-env" not in msg
    assert f"postgresql://bob:***@127.0.0.1:{port}/db" in msg
    assert "Check that the server is running" in msg
