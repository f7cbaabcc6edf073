"""Source tables: where they are, what they hold, and the up-front checks on them.

``resolve_sources`` maps every table of the spec to a file (or a folder of files) and a
format. ``check_sources`` reads only file metadata (schemas and row counts) and fails with
a ``UserError`` naming the table, file, column and fix before any expensive work starts.
CSV has no metadata: its column types are inferred over the whole file and every cell is
parsed once here, with the ``source.csv`` settings retrieve uses (``tasks/sources/csv.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from tasks.runtime.errors import UserError
from tasks.sources import csv as csv_source
from tasks.spec import CsvOptions, Spec

SUFFIX_FORMAT = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".arrow": "ipc",
    ".ipc": "ipc",
    ".feather": "ipc",
    ".csv": "csv",
}


@dataclass(frozen=True)
class SourceTable:
    name: str
    files: tuple[Path, ...]
    format: str
    csv: CsvOptions | None = None  # CSV reading settings (None: the defaults)
    # (column, kind) of the spec's numeric and timestamp columns in this table: a CSV column
    # empty in every row has no type of its own, and is read as what the spec declares
    declared: tuple[tuple[str, str], ...] = ()

    @property
    def csv_options(self) -> CsvOptions:
        return self.csv or CsvOptions()

    @cached_property
    def csv_schema(self) -> pl.Schema:
        """CSV column types, inferred once and then pinned for every read of this table."""
        inferred = csv_source.infer_schema(self.name, self.files, self.csv_options)
        return csv_source.type_empty_columns(self.files, self.csv_options, inferred, self.declared)

    def scan_csv(self, path: Path) -> pl.LazyFrame:
        """One of this table's CSV files, read with the settings and types of the checks."""
        return csv_source.scan(path, self.csv_options, self.csv_schema)

    @cached_property
    def schema(self) -> pa.Schema:
        first = self.files[0]
        if self.format == "parquet":
            return pq.read_schema(first)
        if self.format == "ipc":
            with pa.memory_map(str(first)) as f:
                return ipc.open_file(f).schema
        return self.csv_schema.to_arrow()

    @cached_property
    def num_rows(self) -> int:
        if self.format == "parquet":
            return sum(pq.ParquetFile(f).metadata.num_rows for f in self.files)
        if self.format == "ipc":
            total = 0
            for f in self.files:
                with pa.memory_map(str(f)) as src:
                    reader = ipc.open_file(src)
                    total += sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
            return total
        return csv_source.count_rows(self.name, self.files, self.csv_options, self.csv_schema)


def resolve_sources(spec: Spec, base: Path, tables: Mapping[str, str] | None = None) -> dict[str, SourceTable]:
    """Map table names to files (``tables``: instead of ``source.tables``, e.g. a RelBench folder's
    ``db/``); relative paths are taken from ``base``."""
    out = {}
    for name, raw in (spec.source.tables if tables is None else tables).items():
        path = Path(raw) if Path(raw).is_absolute() else base / raw
        if path.is_dir():
            files = tuple(sorted(p for p in path.iterdir() if p.suffix in SUFFIX_FORMAT))
        else:
            files = (path,)
        if not files or not all(f.is_file() for f in files):
            raise UserError(
                f"Table '{name}': file '{path}' does not exist. Fix source.tables.{name} in the "
                "spec (relative paths are read from "
                f"'{base}'), or generate the data first."
            )
        fmt = spec.source.format or SUFFIX_FORMAT.get(files[0].suffix.lower())
        if fmt is None:
            raise UserError(
                f"Table '{name}': cannot tell the format of '{files[0].name}' from its suffix; "
                "use .parquet, .arrow/.ipc/.feather or .csv, or set source.format."
            )
        if fmt == "csv":
            out[name] = SourceTable(name, files, fmt, spec.source.csv, _declared(spec, name))
        else:
            out[name] = SourceTable(name, files, fmt)
    return out


def _declared(spec: Spec, table: str) -> tuple[tuple[str, str], ...]:
    """The spec's numeric and timestamp columns of ``table``, over every node that reads it."""
    tables = [
        (spec.schema_.root.table, spec.schema_.root.columns),
        *((b.table, b.columns) for b, _ in spec.schema_.walk()),
    ]
    kinds = {c: k for t, columns in tables if t == table for c, k in columns.items() if k in ("numeric", "timestamp")}
    return tuple(sorted(kinds.items()))


def _kind_fits(kind: str, dtype: pa.DataType) -> bool:
    if pa.types.is_null(dtype):  # no value at all: retrieve reads it as the kind (NULL_COLUMN_TYPES)
        return True
    if kind == "numeric":
        return bool(pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_decimal(dtype))
    if kind == "timestamp":
        return bool(pa.types.is_date(dtype) or pa.types.is_timestamp(dtype))
    if kind == "text":
        return bool(pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or pa.types.is_string_view(dtype))
    return not (pa.types.is_nested(dtype) or pa.types.is_floating(dtype))


def _is_text(dtype: pa.DataType) -> bool:
    return bool(pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or pa.types.is_string_view(dtype))


def check_sources(spec: Spec, sources: dict[str, SourceTable]) -> None:
    """Cheap metadata checks: tables not empty, columns exist with usable types, keys exist."""
    # Emptiness first: an empty CSV has no types to infer, so a column check would mislead.
    used = {spec.schema_.root.table, *(b.table for b, _ in spec.schema_.walk())}
    for name in sorted(used):
        if sources[name].num_rows == 0:
            raise UserError(
                f"Table '{name}' ({sources[name].files[0]}) is empty: a benchmark needs rows. "
                "Regenerate or point source.tables at a file with data."
            )
    schemas = {name: src.schema for name, src in sources.items()}

    def need(table: str, column: str, role: str) -> pa.DataType:
        schema = schemas[table]
        if column not in schema.names:
            src = sources[table]
            hint = csv_source.separator_hint(schema.names, src.csv_options) if src.format == "csv" else ""
            raise UserError(
                f"Column '{column}' ({role}) is not in table '{table}' "
                f"({src.files[0]}). Its columns are: {', '.join(schema.names)}. "
                f"Fix the spec to use one of them.{hint}"
            )
        return schema.field(column).type

    def columns(table: str, cols: Mapping[str, str], where: str) -> None:
        for col, kind in cols.items():
            dtype = need(table, col, f"{where}.columns.{col}")
            if not _kind_fits(kind, dtype):
                src = sources[table]
                hint = ""
                if src.format == "csv" and kind != "category" and _is_text(dtype):
                    hint = csv_source.misfit_hint(table, src.files, src.csv_options, src.csv_schema, col, kind, where)
                raise UserError(
                    f"Column '{col}' of table '{table}' ({src.files[0]}) has type "
                    f"{'string' if _is_text(dtype) else dtype}, which "
                    f"cannot be read as '{kind}' ({where}.columns.{col}). Use numeric for "
                    "ints/floats/decimals, timestamp for dates/datetimes, category for "
                    "strings/ints, text for strings (free text, encoded by run.text.encoder)."
                    f"{hint}"
                )

    root = spec.schema_.root
    need(root.table, root.key, "schema.root.key")
    columns(root.table, root.columns, "schema.root")
    for branch, _ in spec.schema_.walk():
        where = f"branch '{branch.name}'"
        need(branch.table, branch.parent_key, f"{where} parent_key")
        if branch.key:
            need(branch.table, branch.key, f"{where} key")
        if branch.order_by:
            need(branch.table, branch.order_by.column, f"{where} order_by.column")
        columns(branch.table, branch.columns, where)
    task = spec.task
    target_table = root.table if task.branch is None else {b.name: b for b, _ in spec.schema_.walk()}[task.branch].table
    dtype = need(target_table, task.target, "task.target")
    if task.kind == "regression" and not _kind_fits("numeric", dtype):
        raise UserError(
            f"task.target '{task.target}' has type {dtype}; a regression target must be numeric. "
            "Use task.kind: category for labels."
        )
