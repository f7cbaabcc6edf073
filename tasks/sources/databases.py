"""Tables in a database: DuckDB (embedded default) and PostgreSQL (a real server).

``source.database.url`` replaces files: the schema's tables are database tables of the same
name. Reads come back as Arrow end to end (DuckDB's Arrow output, ADBC for PostgreSQL),
never as Python rows. Two query shapes, both bound as parameters:

- a few keys (a request): ``WHERE key = ANY($1)``, a parameterised key lookup (DuckDB, up to
  ``DUCKDB_IN_KEYS`` keys: ``WHERE key IN ($1, .., $n)``, one parameter per key);
- many keys (an offline chunk): the same statement with the keys bound as one Arrow list
  (PostgreSQL) or a semi-join against the keys registered as an Arrow table (DuckDB).

Bytes read are the Arrow bytes of the result: what crossed from the database into the
harness. Loaders build a database from the generated TPC-H Parquet with every key and
parent-key column indexed (``relflow-bench data tpch --into duckdb|postgresql://...``).

Credentials: ``${VAR}`` in a URL is read from the environment at connect time, and libpq
reads ``PGPASSWORD`` / ``~/.pgpass`` itself. Every URL this module shows is masked
(``tasks.runtime.masking``); the expanded URL never leaves ``Connection``.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tasks.measure.clock import wall_clock
from tasks.runtime import interrupts
from tasks.runtime.errors import UserError
from tasks.runtime.masking import mask_secrets
from tasks.spec import Spec

# Few keys bind as a parameter list; more become an Arrow relation (DuckDB) or list (PG).
LOOKUP_KEYS = 64
# DuckDB plans ``key IN ($1, .., $n)`` with up to 4 parameters as a filter on the (index) scan,
# but ``key = ANY($1)`` (and a longer IN list) as a join against the unnested list: about twice
# the time of a one-root request's lookup. The same rows either way (a null key matches neither).
DUCKDB_IN_KEYS = 4

# TPC-H primary and foreign keys: the key and parent-key columns a schema joins on.
TPCH_KEYS = {
    "region": ("r_regionkey",),
    "nation": ("n_nationkey", "n_regionkey"),
    "supplier": ("s_suppkey", "s_nationkey"),
    "customer": ("c_custkey", "c_nationkey"),
    "part": ("p_partkey",),
    "partsupp": ("ps_partkey", "ps_suppkey"),
    "orders": ("o_orderkey", "o_custkey"),
    "lineitem": ("l_orderkey", "l_partkey", "l_suppkey"),
}
DUCKDB_FILE = "tpch.duckdb"


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _expand(url: str) -> str:
    """``${VAR}`` from the environment; a missing variable is a user error, not ''."""

    def sub(m: re.Match[str]) -> str:
        if m[1] not in os.environ:
            raise UserError(
                f"source.database.url {mask_secrets(url)} uses ${{{m[1]}}}, which "
                f"is not set in the environment; export {m[1]} first."
            )
        return os.environ[m[1]]

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", sub, url)


def kind_of(url: str) -> str:
    if url == "duckdb" or url.startswith("duckdb:"):
        return "duckdb"
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql"
    raise UserError(
        f"source.database.url {mask_secrets(url)!r} is not a supported database; use 'duckdb' "
        "(built from the generated TPC-H), 'duckdb:<path to .duckdb file>' or "
        "'postgresql://user@host:port/dbname'."
    )


def duckdb_path(url: str, base: Path, generated_dir: Path | None) -> Path:
    """The DuckDB file a ``duckdb`` / ``duckdb:<path>`` URL names."""
    rest = url.removeprefix("duckdb").removeprefix(":")
    rest = rest.removeprefix("//") if rest.startswith("///") else rest
    if not rest:
        if generated_dir is None:
            raise UserError(
                "source.database.url 'duckdb' means the file built from the generated TPC-H "
                "data, but the spec has no source.generate; add source.generate.tpch.scale or "
                "name a file: 'duckdb:<path>'."
            )
        return generated_dir / DUCKDB_FILE
    path = Path(_expand(rest))
    return path if path.is_absolute() else base / path


class Connection:
    """One open connection per database per process; queries return Arrow tables."""

    def __init__(self, url: str, duckdb_file: Path | None = None) -> None:
        self.url, self.kind = url, kind_of(url)
        self.shown = mask_secrets(url) if duckdb_file is None else f"duckdb:{duckdb_file}"
        self._con: Any = None  # a DuckDB or ADBC (PostgreSQL) connection
        self._cur: Any = None  # the ADBC cursor (PostgreSQL)
        self._lock = threading.Lock()  # Prefect may call from different threads, one at a time
        if self.kind == "duckdb":
            import duckdb

            assert duckdb_file is not None
            if not duckdb_file.is_file():
                raise UserError(
                    f"DuckDB file '{duckdb_file}' does not exist; build it with 'relflow-bench "
                    "data tpch --scale S --into duckdb' (or 'duckdb:<path>' for your own file)."
                )
            try:
                self._con = duckdb.connect(str(duckdb_file), read_only=True)
            except duckdb.Error as err:
                raise UserError(
                    f"Cannot open DuckDB file '{duckdb_file}': {err}. Rebuild it with "
                    "'relflow-bench data tpch --scale S --into duckdb'."
                ) from None
        else:
            import adbc_driver_postgresql.dbapi as pg

            try:
                self._con = pg.connect(_expand(url), autocommit=True)
            except pg.Error as err:
                first = mask_secrets(str(err)).strip().splitlines()[0]
                raise UserError(
                    f"Cannot connect to database {self.shown}: {first}. Check that the server "
                    "is running and the host, port, database and user in source.database.url; "
                    "the password comes from PGPASSWORD, ~/.pgpass or ${VAR} in the URL."
                ) from None
            self._cur = self._con.cursor()

    def query(self, sql: str, params: list[Any] | pa.RecordBatch | None = None) -> pa.Table:
        with self._lock:
            if self.kind == "duckdb":
                return self._con.sql(sql, params=params).to_arrow_table()
            self._cur.execute(sql, parameters=params)
            return self._cur.fetch_arrow_table()

    def semi_join(self, sql_head: str, key: str, keys: pa.Array) -> pa.Table:
        """``sql_head WHERE key IN keys`` with the keys bound, not spelled into the SQL."""
        if len(keys) <= LOOKUP_KEYS:  # a request: a parameterised key lookup
            values = keys.to_pylist()
            if self.kind == "duckdb" and 0 < len(values) <= DUCKDB_IN_KEYS:
                marks = ", ".join(f"${i}" for i in range(1, len(values) + 1))
                return self.query(f"{sql_head} WHERE {quote(key)} IN ({marks})", values)
            return self.query(f"{sql_head} WHERE {quote(key)} = ANY($1)", [values])
        if self.kind == "postgresql":
            lst = pa.ListArray.from_arrays(pa.array([0, len(keys)], pa.int32()), keys)
            return self.query(f"{sql_head} WHERE {quote(key)} = ANY($1)", pa.record_batch([lst], names=["keys"]))
        with self._lock:
            self._con.register("__relflow_keys", pa.table({"k": keys}))
            try:
                return self._con.sql(
                    f"{sql_head} WHERE {quote(key)} IN (SELECT k FROM __relflow_keys)"
                ).to_arrow_table()
            finally:
                self._con.unregister("__relflow_keys")

    def has_table(self, table: str) -> bool:
        if self.kind == "duckdb":
            sql = "SELECT count(*) AS n FROM information_schema.tables WHERE table_name = $1"
        else:
            sql = (
                "SELECT count(*) AS n FROM information_schema.tables WHERE table_name = $1 "
                "AND table_schema = ANY(current_schemas(false))"
            )
        return bool(self.query(sql, [table])["n"][0].as_py() > 0)

    def schema(self, table: str) -> pa.Schema:
        """The table's columns as the Arrow types a read returns (after ``conform``)."""
        schema = self.query(f"SELECT * FROM {quote(table)} LIMIT 0").schema
        if self.kind == "duckdb":
            return schema
        info = self.query(
            "SELECT column_name, numeric_precision AS p, numeric_scale AS s FROM "
            "information_schema.columns WHERE table_name = $1 AND data_type = 'numeric'",
            [table],
        ).to_pylist()
        numeric = {r["column_name"]: r for r in info}
        fields = []
        for f in schema:
            if f.name in numeric:  # ADBC hands numeric over as text; the declared type is decimal
                r = numeric[f.name]
                f = pa.field(f.name, pa.decimal128(r["p"], r["s"]) if r["p"] else pa.float64())
            fields.append(pa.field(f.name, f.type))
        return pa.schema(fields)

    def close(self) -> None:
        with self._lock:
            if self.kind == "postgresql":
                self._cur.close()
            self._con.close()


_OPEN: dict[str, Connection] = {}


def connect(url: str, duckdb_file: Path | None = None) -> Connection:
    ident = str(duckdb_file) if duckdb_file else url
    if ident not in _OPEN:
        _OPEN[ident] = Connection(url, duckdb_file)
    return _OPEN[ident]


def close_all() -> None:
    """Close every connection this process opened (the end of a run, tests)."""
    while _OPEN:
        _OPEN.popitem()[1].close()


@dataclass(frozen=True)
class DatabaseTable:
    """A table in a database: ``name``, ``format``, ``files``, ``schema`` and ``num_rows`` as a
    ``tasks.sources.files.SourceTable`` has them (``tasks.sources.tables.Table`` is either)."""

    name: str
    db: Connection

    @property
    def format(self) -> str:
        return self.db.kind

    @property
    def files(self) -> tuple[str, ...]:  # what error messages show as the table's location
        return (f"{self.db.shown} table {self.name}",)

    @cached_property
    def schema(self) -> pa.Schema:
        return self.db.schema(self.name)

    @property
    def num_rows(self) -> int:
        return int(self.db.query(f"SELECT count(*) AS n FROM {quote(self.name)}")["n"][0].as_py())

    def conform(self, table: pa.Table) -> pa.Table:
        """Cast a result to ``schema`` (PostgreSQL numeric arrives as text)."""
        want = pa.schema([self.schema.field(n) for n in table.column_names])
        if table.schema.equals(want):
            return table
        cols = []
        for col, field in zip(table.columns, want, strict=True):
            if isinstance(col.type, pa.BaseExtensionType):
                col = pa.chunked_array([c.storage for c in col.chunks], col.type.storage_type)
            cols.append(col.cast(field.type))
        return pa.Table.from_arrays(cols, schema=want)

    def read(self, columns: list[str], key: str, keys: pa.Array) -> tuple[pa.Table, int]:
        head = f"SELECT {', '.join(quote(c) for c in columns)} FROM {quote(self.name)}"
        table = self.conform(self.db.semi_join(head, key, keys))
        return table, table.nbytes

    def distinct(self, column: str) -> tuple[pa.Array, int]:
        t = self.db.query(f"SELECT DISTINCT {quote(column)} AS k FROM {quote(self.name)} ORDER BY 1")
        return t["k"].combine_chunks(), t.nbytes


def resolve_database(
    spec: Spec, base: Path, generated_dir: Path | None, tables: list[str] | None = None
) -> dict[str, DatabaseTable]:
    """Open the spec's database and map every schema table (or ``tables``) to it; a missing table
    or a connection failure is a ``UserError`` with the URL masked and the fix."""
    assert spec.source.database is not None  # callers open a database only when the spec names one
    url = spec.source.database.url
    kind = kind_of(url)
    file = duckdb_path(url, base, generated_dir) if kind == "duckdb" else None
    if kind == "duckdb" and url == "duckdb" and generated_dir is not None:
        assert file is not None  # duckdb_path gives one for duckdb URLs
        build_duckdb(generated_dir, file)  # the embedded default is built on first use
    db = connect(url, file)
    used = tables if tables is not None else [spec.schema_.root.table, *(b.table for b, _ in spec.schema_.walk())]
    out = {}
    for name in dict.fromkeys(used):
        if not db.has_table(name):
            hint = (
                "'relflow-bench data tpch --scale S --into duckdb'"
                if kind == "duckdb"
                else f"'relflow-bench data tpch --scale S --into {db.shown}'"
            )
            raise UserError(
                f"Table '{name}' is not in database {db.shown}. Load the data with {hint}, or "
                "fix the schema's table names (with source.database they are database tables)."
            )
        out[name] = DatabaseTable(name, db)
    return out


# ---- loaders: generated Parquet -> database, key columns indexed ---------------------------


def _tables(folder: Path) -> dict[str, Path]:
    return {p.stem: p for p in sorted(folder.glob("*.parquet"))}


def _count(con: Any, table: str) -> int:
    return int(con.execute(f"SELECT count(*) FROM {quote(table)}").fetchone()[0])


def build_duckdb(folder: Path, target: Path, keys: dict[str, tuple[str, ...]] = TPCH_KEYS) -> dict[str, int]:
    """A DuckDB file with every Parquet table of ``folder``; written to a temp file and
    renamed, so a half-built database is never opened. Returns rows per table."""
    import duckdb

    if target.is_file():
        con = duckdb.connect(str(target), read_only=True)
        try:
            return {
                t: _count(con, t) for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()
            }
        finally:
            con.close()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    tmp.unlink()  # DuckDB creates the file itself
    rows: dict[str, int] = {}

    def remove_tmp() -> None:
        tmp.unlink(missing_ok=True)
        Path(f"{tmp}.wal").unlink(missing_ok=True)

    with interrupts.removed_on_exit(remove_tmp):  # however this ends, a signal included
        con = duckdb.connect(str(tmp))
        try:
            for name, path in _tables(folder).items():
                con.execute(f"CREATE TABLE {quote(name)} AS SELECT * FROM read_parquet($1)", [str(path)])
                for col in keys.get(name, ()):
                    con.execute(f"CREATE INDEX {quote(f'{name}_{col}')} ON {quote(name)} ({quote(col)})")
                rows[name] = _count(con, name)
            con.execute("CHECKPOINT")
        finally:
            con.close()
        os.replace(tmp, target)
    return rows


_PG_TYPES: list[tuple[Callable[[pa.DataType], Any], Callable[[pa.DataType], str]]] = [
    (pa.types.is_int64, lambda t: "bigint"),
    (pa.types.is_int32, lambda t: "integer"),
    (pa.types.is_int16, lambda t: "smallint"),
    (pa.types.is_int8, lambda t: "smallint"),
    (pa.types.is_float64, lambda t: "double precision"),
    (pa.types.is_float32, lambda t: "real"),
    (pa.types.is_decimal, lambda t: f"numeric({t.precision},{t.scale})"),
    (pa.types.is_boolean, lambda t: "boolean"),
    (pa.types.is_date, lambda t: "date"),
    (pa.types.is_timestamp, lambda t: "timestamptz" if t.tz else "timestamp"),
    (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t), lambda t: "text"),
]


def _pg_type(t: pa.DataType) -> str:
    for test, name in _PG_TYPES:
        if test(t):
            return name(t)
    raise UserError(
        f"Arrow type {t} has no PostgreSQL column type in the loader; load that table yourself or drop the column."
    )


def _plain_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema(
        [pa.field(f.name, pa.string() if pa.types.is_string_view(f.type) else f.type, f.nullable) for f in schema]
    )


def load_postgresql(url: str, folder: Path, keys: dict[str, tuple[str, ...]] = TPCH_KEYS) -> dict[str, int]:
    """Replace the Parquet tables of ``folder`` in PostgreSQL (DDL with the Parquet types,
    binary COPY through ADBC, key indexes, ANALYZE), each table in one transaction."""
    import adbc_driver_postgresql.dbapi as pg

    shown = mask_secrets(url)
    try:
        con = pg.connect(_expand(url))
    except pg.Error as err:
        raise UserError(
            f"Cannot connect to database {shown}: "
            f"{mask_secrets(str(err)).strip().splitlines()[0]}. Check the server and "
            "the URL; the password comes from PGPASSWORD or ~/.pgpass."
        ) from None
    rows: dict[str, int] = {}
    try:
        cur = con.cursor()
        for name, path in _tables(folder).items():
            pf = pq.ParquetFile(path)
            schema = _plain_schema(pf.schema_arrow)
            cols = ", ".join(
                f"{quote(f.name)} {_pg_type(f.type)}" + ("" if f.nullable else " NOT NULL") for f in schema
            )
            cur.execute(f"DROP TABLE IF EXISTS {quote(name)}")
            cur.execute(f"CREATE TABLE {quote(name)} ({cols})")
            batches = (b.cast(schema) for b in pf.iter_batches(batch_size=65_536))
            rows[name] = cur.adbc_ingest(name, pa.RecordBatchReader.from_batches(schema, batches), mode="append")
            for col in keys.get(name, ()):
                cur.execute(f"CREATE INDEX {quote(f'{name}_{col}')} ON {quote(name)} ({quote(col)})")
            con.commit()
            cur.execute(f"ANALYZE {quote(name)}")
            con.commit()
        cur.close()
    finally:
        con.close()
    return rows


def load_tpch(scale: float, into: str) -> tuple[str, dict[str, int], float]:
    """``relflow-bench data tpch --into``: (shown target, rows per table, seconds)."""
    from tasks.datasets.tpch import ensure_tpch

    folder, _ = ensure_tpch(scale)
    t0 = wall_clock()
    kind = kind_of(into)
    if kind == "duckdb":
        file = duckdb_path(into, Path.cwd(), folder)
        rows = build_duckdb(folder, file)
        return f"duckdb:{file}", rows, wall_clock() - t0
    rows = load_postgresql(into, folder)
    return mask_secrets(into), rows, wall_clock() - t0
