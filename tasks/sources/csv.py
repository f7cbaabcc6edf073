"""CSV tables, read one way everywhere: the up-front checks and the retrieve stage.

The settings are the spec's ``source.csv`` (defaults: what ``pandas.read_csv`` reads by
default, its NA markers included). Column types are inferred once per table, over the
whole file unless ``source.csv.infer_schema_rows`` limits it, and then *pinned*: the
up-front check parses every row with that schema and retrieve reads with exactly the same
one, so a cell that does not fit fails before any Prefect or MLflow work, never halfway
through a timed run. Polars' parse errors become ``UserError``s that name the table, the
file, the column, the offending value and the ``source.csv`` key that fixes it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import polars as pl

from tasks.runtime.errors import UserError
from tasks.spec import CsvOptions

# Polars: "could not parse `VALUE` as dtype `DTYPE` at column 'NAME' (column number N)"
_PARSE = re.compile(
    r"could not parse `(?P<value>.*?)` as dtype `(?P<dtype>[^`]*)` at column "
    r"'(?P<column>.*?)'",
    re.DOTALL,
)
_NUMBER_WITH_COMMA = re.compile(r"^\s*[-+]?\d{1,3}(\.\d{3})*,\d+\s*$|^\s*[-+]?\d+,\d+\s*$")


def scan(path: Path, opts: CsvOptions, schema: pl.Schema | None = None) -> pl.LazyFrame:
    """One CSV file as a lazy frame; ``schema`` pins the column types (no inference)."""
    kw: dict[str, Any] = dict(
        separator=opts.separator,
        quote_char=opts.quote_char,
        has_header=opts.has_header,
        null_values=list(opts.null_values) or None,
        try_parse_dates=True,
        decimal_comma=opts.decimal_comma,
    )
    if schema is None:
        kw["infer_schema_length"] = opts.infer_schema_rows
    else:
        kw["schema"] = schema
    if opts.encoding in ("utf8", "utf8-lossy"):
        lf = pl.scan_csv(path, encoding="utf8" if opts.encoding == "utf8" else "utf8-lossy", **kw)
    else:  # Polars reads only UTF-8 natively; other codecs are decoded in memory first.
        lf = pl.read_csv(path, encoding=opts.encoding, **kw).lazy()
    if schema is None and not opts.has_header:
        # Headerless columns are column_1, column_2, ... whatever Polars' own numbering is.
        lf = lf.rename({n: f"column_{i + 1}" for i, n in enumerate(lf.collect_schema().names())})
    return lf


def infer_schema(table: str, files: tuple[Path, ...], opts: CsvOptions) -> pl.Schema:
    """Column types over every file of the table (each file fully, by default), unified."""
    empties = []
    for path in files:
        try:
            schema = scan(path, opts).collect_schema()
        except pl.exceptions.NoDataError:  # a zero-byte file: no columns, no rows
            continue
        except (pl.exceptions.PolarsError, UnicodeDecodeError) as err:
            raise explain(err, table, path, opts) from None
        empties.append(pl.DataFrame(schema=schema))
    if not empties:
        return pl.Schema()
    try:
        return pl.concat(empties, how="vertical_relaxed").schema
    except pl.exceptions.PolarsError as err:
        raise UserError(
            f"Table '{table}': its CSV files do not share columns and types ({err}). Make "
            "every file of the folder have the same header."
        ) from None


# What a column empty in every row is read as, by its declared kind (Polars types it as text).
_EMPTY_COLUMN_TYPES: dict[str, pl.DataType] = {"numeric": pl.Float64(), "timestamp": pl.Datetime("us")}


def type_empty_columns(
    files: tuple[Path, ...], opts: CsvOptions, schema: pl.Schema, declared: tuple[tuple[str, str], ...]
) -> pl.Schema:
    """``schema`` with each declared numeric or timestamp column that is null in every row of
    every file typed as its kind: Polars infers such a column as text, and the column check
    would then refuse an empty optional field as "type string". Only declared columns inferred
    as text are scanned, each for one non-null cell."""
    empty_candidates = [(c, k) for c, k in declared if schema.get(c) == pl.String]
    if not empty_candidates:
        return schema
    names = [c for c, _ in empty_candidates]
    frames = [scan(p, opts, schema).select(pl.col(names).is_not_null().any()) for p in files]
    try:
        seen = pl.concat(frames).select(pl.all().any()).collect().row(0)
    except pl.exceptions.NoDataError:
        return schema
    out = pl.Schema(schema)
    for (column, kind), has_value in zip(empty_candidates, seen, strict=True):
        if not has_value:
            out[column] = _EMPTY_COLUMN_TYPES[kind]
    return out


def count_rows(table: str, files: tuple[Path, ...], opts: CsvOptions, schema: pl.Schema) -> int:
    """Rows of the table, parsing every cell with the pinned schema (the up-front check)."""
    total = 0
    for path in files:
        try:
            # null_count touches every column, so every cell is parsed, not just counted.
            counts = scan(path, opts, schema).select(pl.len(), pl.all().null_count()).collect()
        except pl.exceptions.NoDataError:
            continue
        except (pl.exceptions.PolarsError, UnicodeDecodeError) as err:
            raise explain(err, table, path, opts) from None
        total += int(counts.item(0, 0))
    return total


def explain(err: BaseException, table: str, path: Path, opts: CsvOptions) -> UserError:
    """A Polars CSV error as one paragraph: table, file, column, value and the key to change."""
    text = str(err)
    where = f"Table '{table}' ({path})"
    if isinstance(err, UnicodeDecodeError) or "utf-8" in text.lower() or "utf8" in text.lower():
        return UserError(
            f"{where} is not valid {opts.encoding} text ({text.splitlines()[0]}). Set "
            "source.csv.encoding to the file's encoding (e.g. latin-1 or cp1252), or utf8-lossy "
            "to replace the bad bytes."
        )
    m = _PARSE.search(text)
    if m is None:
        first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
        return UserError(
            f"{where} cannot be read as CSV: {first}. Check source.csv (separator "
            f"{opts.separator!r}, quote_char {opts.quote_char!r}, encoding {opts.encoding!r}, "
            f"has_header {opts.has_header}).{separator_hint([_first_line(path, opts)], opts)}"
        )
    value, dtype, column = m["value"], m["dtype"], m["column"]
    shown = value if len(value) <= 60 else value[:57] + "..."
    nulls = _add_null(shown)
    if "not properly escaped" in text or dtype == "str":
        return UserError(
            f"{where}, column '{column}': the field {shown!r} is not properly quoted (an "
            f"unclosed {opts.quote_char!r}). Fix the file, or set source.csv.quote_char to the "
            "file's quote character (null reads quotes as ordinary text)."
        )
    return UserError(
        f"{where}, column '{column}': the value {shown!r} cannot be read as {dtype}, the type "
        f"inferred from the rows before it. If it marks a missing value, {nulls}; otherwise set "
        "source.csv.infer_schema_rows to null (the default) so the type is inferred over the "
        "whole file."
    )


def first_misfit(
    files: tuple[Path, ...], opts: CsvOptions, schema: pl.Schema, column: str, kind: str
) -> tuple[int, str] | None:
    """The first (1-based data row, text) of a text column that is not a ``kind`` value."""
    frames = [scan(p, opts, schema).select(pl.col(column)) for p in files]
    text = pl.col(column).cast(pl.String)
    if kind == "numeric":
        parsed = text.str.strip_chars().cast(pl.Float64, strict=False)
    else:
        parsed = text.str.to_datetime(strict=False)
    try:
        bad = (
            pl.concat(frames)
            .with_row_index("row", offset=1)
            .filter(pl.col(column).is_not_null() & parsed.is_null())
            .head(1)
            .collect()
        )
    except pl.exceptions.PolarsError:  # no datetime format could be inferred at all
        bad = pl.concat(frames).with_row_index("row", offset=1).filter(pl.col(column).is_not_null()).head(1).collect()
    if bad.height == 0:
        return None
    return int(bad["row"][0]), str(bad[column][0])


def misfit_hint(
    table: str, files: tuple[Path, ...], opts: CsvOptions, schema: pl.Schema, column: str, kind: str, where: str
) -> str:
    """Why a CSV column read as text is not ``kind``, and which ``source.csv`` key helps."""
    found = first_misfit(files, opts, schema, column, kind)
    if found is None:
        return ""
    row, value = found
    if kind == "numeric":
        fix = (
            f"If it marks a missing value, {_add_null(value)}"
            + (
                "; the file writes decimal commas: set source.csv.decimal_comma: true"
                if _NUMBER_WITH_COMMA.match(value) and not opts.decimal_comma
                else ""
            )
            + f"; otherwise declare the column as category ({where}.columns.{column})."
        )
        what = "is not a number"
    else:
        fix = (
            f"If it marks a missing value, {_add_null(value)}; otherwise write "
            "the column in one ISO 8601 format throughout (YYYY-MM-DD or YYYY-MM-DD HH:MM:SS)."
        )
        what = "is not a date/datetime (in the format of the column's other values)"
    return f" The column is read as text because of the value {value!r} (data row {row}), which {what}. {fix}"


def _add_null(value: str) -> str:
    return (
        f"add it to source.csv.null_values (a list you give replaces the default, pandas' NA "
        f"markers: keep the ones the file uses, e.g. null_values: ['', 'NA', {value!r}])"
    )


def _first_line(path: Path, opts: CsvOptions) -> str:
    codec = "utf-8" if opts.encoding.startswith("utf8") else opts.encoding
    with open(path, encoding=codec, errors="replace") as f:
        return f.readline(65_536)


def separator_hint(names: list[str], opts: CsvOptions) -> str:
    """A one-column table whose name holds another delimiter was split on the wrong one."""
    if len(names) != 1 or opts.separator in names[0]:
        return ""
    for sep in (";", "\t", "|", ","):
        if sep != opts.separator and sep in names[0]:
            return (
                f" The file reads as a single column: it looks separated by {sep!r}; set source.csv.separator: {sep!r}."
            )
    return ""
