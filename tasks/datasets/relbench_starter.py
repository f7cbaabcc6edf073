"""A starter RelBench folder for a user's own tables (``relflow-bench relbench-init``).

RelBench 3.0.2 reads a dataset folder (``manifest.yaml``, ``db/<table>.parquet``,
``tasks/<task>/manifest.yaml``) with ``relbench.load.RelBenchDataset``. Writing one by hand
means getting its key contract right, which RelBench checks only when the database is built:

- every primary key is ``0..N-1`` in row order (``Dataset.validate_and_correct_db``), so keys
  are re-indexed here and every foreign key remapped; ``keymap/<table>.parquet`` holds
  ``(original, <pkey>)`` so predictions can be mapped back to the user's keys;
- a table with a primary key *and* a time column must be sorted by time (missing times last):
  ``Database.upto(test_timestamp)`` keeps the rows at or before the cut with ``DataFrame.query``,
  and the check above then needs the survivors to still be ``0..k-1``, i.e. a prefix;
- dates become timestamps (``datetime64[ns]``: RelBench compares them with ``pd.Timestamp``),
  time zones become naive UTC, decimals become float64 (pandas reads them as Python objects).

What is inferred (the user checks it; the command prints it):

- primary key: the first unique, non-null integer or string column named ``id``,
  ``<table>_id``, ``<table>id``, ``<table>_key`` (also with the table name singular), else the
  first such column ending in ``key`` / ``_id``;
- foreign keys: a column of another table named like this table's primary key (equal, or
  equal after a short ``x_`` prefix: ``o_custkey`` -> ``c_custkey``) or ``<table>_id`` /
  ``<table>id`` / ``<table>_key``, of the same kind, whose non-null values all are keys of it;
- time column: the first date or timestamp column;
- ``val_timestamp`` / ``test_timestamp``: the 70% and 85% quantiles of every time value
  (placeholders: a real task picks them from the question it asks);
- ``tasks/example-task/manifest.yaml``: a commented forecast task (how many rows of a child
  table each parent has in the next window) that loads as it is, for the user to rewrite.

Everything is columnar (Polars); the folder is written to a temporary sibling and renamed
into place, so an interrupted run leaves nothing behind.
"""

from __future__ import annotations

import keyword
import re
import shutil
import tempfile
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import cast

import polars as pl

from tasks.runtime import interrupts
from tasks.runtime.errors import UserError

KEYMAP_ORIGINAL = "original"
VAL_QUANTILE = 0.70
TEST_QUANTILE = 0.85
EXAMPLE_TASK = "example-task"
READABLE = (".parquet", ".pq", ".csv")
WINDOWS_DAYS = (1, 7, 14, 30, 60, 90, 180, 365)  # the example task's window: the longest that fits


@dataclass(frozen=True)
class TableKeys:
    """What RelBench's ``TableSpec`` holds for one table: primary key, time column, foreign keys."""

    pkey: str | None = None
    time_col: str | None = None
    fkeys: dict[str, str] = field(default_factory=dict)  # column -> table it points at


@dataclass(frozen=True)
class StarterResult:
    """What ``write_starter`` wrote and inferred, and what the user must still check."""

    folder: Path
    tables: dict[str, TableKeys]
    rows: dict[str, int]
    val_timestamp: str
    test_timestamp: str
    example_task: str | None
    notes: list[str]


# --- RelBench's key contract, shared with relbench_tpch.py ---------------------------------


def normalise_types(df: pl.DataFrame) -> pl.DataFrame:
    """Dates and timestamps -> naive ``Datetime('ns')`` (time zones as UTC), decimals -> float64."""
    exprs = []
    for name, dtype in df.schema.items():
        if dtype == pl.Date:
            exprs.append(pl.col(name).cast(pl.Datetime("ns")))
        elif isinstance(dtype, pl.Datetime):
            col = pl.col(name)
            if dtype.time_zone is not None:
                col = col.dt.convert_time_zone("UTC").dt.replace_time_zone(None)
            exprs.append(col.cast(pl.Datetime("ns")))
        elif isinstance(dtype, pl.Decimal):
            exprs.append(pl.col(name).cast(pl.Float64))
    return df.with_columns(exprs) if exprs else df


def apply_key_contract(
    tables: Mapping[str, pl.DataFrame], keys: Mapping[str, TableKeys]
) -> tuple[dict[str, pl.DataFrame], dict[str, pl.DataFrame]]:
    """RelBench's key contract over whole columns: each table normalised
    (``normalise_types``), sorted by its time column where it has one (stable, missing last),
    its primary key replaced by ``0..N-1`` in that order and every foreign key remapped to the
    new keys (a value with no key becomes null). Returns the tables and, per table with a
    primary key, its key map ``(original, <pkey>)``."""
    ordered: dict[str, pl.DataFrame] = {}
    keymaps: dict[str, pl.DataFrame] = {}
    for name, df in tables.items():
        spec = keys[name]
        df = normalise_types(df)
        if spec.time_col is not None:
            df = df.sort(spec.time_col, nulls_last=True, maintain_order=True)
        if spec.pkey is not None:
            keymaps[name] = pl.DataFrame(
                {KEYMAP_ORIGINAL: df[spec.pkey], spec.pkey: pl.int_range(df.height, eager=True, dtype=pl.Int64)}
            )
            df = df.with_columns(keymaps[name][spec.pkey])
        ordered[name] = df
    out: dict[str, pl.DataFrame] = {}
    for name, df in ordered.items():
        remap = []
        for col, target in keys[name].fkeys.items():
            km = keymaps[target]
            old = km[KEYMAP_ORIGINAL]
            remap.append(pl.col(col).cast(old.dtype, strict=False).replace_strict(old, km[km.columns[1]], default=None))
        out[name] = df.with_columns(remap) if remap else df
    return out, keymaps


def write_db(folder: Path, tables: Mapping[str, pl.DataFrame], keymaps: Mapping[str, pl.DataFrame]) -> None:
    """``db/<table>.parquet`` and ``keymap/<table>.parquet`` under ``folder``."""
    (folder / "db").mkdir(parents=True, exist_ok=True)
    for name, df in tables.items():
        df.write_parquet(folder / "db" / f"{name}.parquet")
    if keymaps:
        (folder / "keymap").mkdir(exist_ok=True)
    for name, km in keymaps.items():
        km.write_parquet(folder / "keymap" / f"{name}.parquet")


def dataset_manifest(
    name: str, val_timestamp: str, test_timestamp: str, keys: Mapping[str, TableKeys], description: str
) -> object:
    """``relbench.manifest.DatasetManifest`` for ``keys`` (typed loosely: relbench is untyped)."""
    from relbench.manifest import DatasetManifest, TableSpec

    return DatasetManifest(
        name=name,
        val_timestamp=val_timestamp,
        test_timestamp=test_timestamp,
        description=description,
        tables={t: TableSpec(pkey=k.pkey, time_col=k.time_col, fkeys=dict(k.fkeys)) for t, k in keys.items()},
    )


# --- inference -------------------------------------------------------------------------------


def _singular(name: str) -> str:
    low = name.lower()
    if low.endswith("ies") and len(low) > 3:
        return low[:-3] + "y"
    if low.endswith(("ses", "xes", "ches", "shes")):
        return low[:-2]
    if low.endswith("s") and not low.endswith("ss") and len(low) > 1:
        return low[:-1]
    return low


def _own_names(table: str) -> list[str]:
    stems = dict.fromkeys([table.lower(), _singular(table)])
    return [f"{s}{sep}{suffix}" for suffix in ("id", "key") for s in stems for sep in ("_", "")]


def _is_key_type(dtype: pl.DataType) -> bool:
    return dtype.is_integer() or dtype in (pl.String, pl.Categorical)


def _key_kind(dtype: pl.DataType) -> str:
    return "int" if dtype.is_integer() else "str"


def _is_unique_key(s: pl.Series) -> bool:
    return _is_key_type(s.dtype) and s.len() > 0 and s.null_count() == 0 and s.n_unique() == s.len()


def infer_pkey(table: str, df: pl.DataFrame) -> str | None:
    """The primary key, by name then uniqueness (see the module docstring), or None."""
    by_lower = {c.lower(): c for c in df.columns}
    named = [by_lower[n] for n in ["id", *_own_names(table)] if n in by_lower]
    suffixed = [c for c in df.columns if c.lower().endswith(("key", "_id")) and c not in named]
    for col in [*named, *suffixed]:
        if _is_unique_key(df[col]):
            return col
    return None


_PREFIX = re.compile(r"^[a-z]{1,3}_", re.IGNORECASE)


def _unprefixed(col: str) -> str | None:
    rest = _PREFIX.sub("", col, count=1).lower()
    return rest if rest != col.lower() and len(rest) > 2 and rest not in ("id", "key") else None


def _names_match(col: str, target: str, target_pkey: str) -> bool:
    low = col.lower()
    if low == target_pkey.lower() or low in _own_names(target):
        return True
    bare = _unprefixed(col)
    return bare is not None and bare == (_unprefixed(target_pkey) or target_pkey.lower())


def infer_fkeys(
    table: str, df: pl.DataFrame, pkeys: Mapping[str, str | None], frames: Mapping[str, pl.DataFrame]
) -> dict[str, str]:
    """Foreign keys of ``table``: name match, same kind, non-null values a subset of the keys."""
    found: dict[str, str] = {}
    for col in df.columns:
        if col == pkeys.get(table) or not _is_key_type(df[col].dtype):
            continue
        values = df[col].drop_nulls()
        if values.len() == 0:
            continue
        for target, tpk in pkeys.items():
            if target == table or tpk is None or not _names_match(col, target, tpk):
                continue
            keys = frames[target][tpk]
            if _key_kind(keys.dtype) != _key_kind(values.dtype):
                continue
            if values.cast(keys.dtype, strict=False).is_in(keys.implode()).all():
                found[col] = target
                break
    return found


def infer_time_col(df: pl.DataFrame) -> str | None:
    """The first date or timestamp column."""
    for name, dtype in df.schema.items():
        if dtype == pl.Date or isinstance(dtype, pl.Datetime):
            return name
    return None


def _all_times(frames: Mapping[str, pl.DataFrame], keys: Mapping[str, TableKeys]) -> pl.Series:
    parts = [frames[t][k.time_col].drop_nulls().alias("t") for t, k in keys.items() if k.time_col is not None]
    if not parts:
        return pl.Series("t", [], dtype=pl.Datetime("ns"))
    return pl.concat(parts).sort()


def _quantile_time(times: pl.Series, q: float) -> datetime:
    """The value at quantile ``q`` of sorted ``times``, floored to the day when the data spans days."""
    value = cast(datetime, times[min(times.len() - 1, int(q * times.len()))])
    span = cast(datetime, times.max()) - cast(datetime, times.min())
    return value.replace(hour=0, minute=0, second=0, microsecond=0) if span.days > 30 else value


def _iso(value: datetime) -> str:
    text = value.isoformat(sep=" ")
    return text[:10] if text.endswith("00:00:00") else text


# --- the example task -----------------------------------------------------------------------


def _example_window_days(times: pl.Series, val: datetime, test: datetime) -> int:
    """Whole days the example task's window may span so that RelBench accepts it: val and test
    windows inside the data, at least 3 training seed times, val's window before test."""
    first, last = cast(datetime, times.min()), cast(datetime, times.max())
    last_before_test = cast(datetime, times.filter(times <= test).max())
    limits = [test - val, last - test, last_before_test - val, (val - first) / 3]
    most = int(min(v.total_seconds() for v in limits) // 86400)
    return max([d for d in WINDOWS_DAYS if d <= most], default=0)


_EXAMPLE_HEADER = """\
# A STARTER task written by `relflow-bench relbench-init`: it loads as it is, but it is only
# an example of the format. Rewrite it into the question you want answered (or delete this
# folder). RelBench 3.0.2 TaskManifest fields:
#   kind: forecast        labels come from `sql`, run by DuckDB over a `timestamps(timestamp)`
#                         relation (the seed times of a split) and every db table by its name;
#                         `{timedelta}` is replaced by the window (pandas' spelling, an INTERVAL)
#   task_type             binary_classification | regression | multiclass_classification
#   entity_table / entity_col   the table and key column each label is about
#   target_col            the label column the SQL returns
#   time_col              the seed-time column the SQL returns (`timestamp`)
#   timedelta             the label window after each seed time: (t, t + timedelta]
#   num_eval_timestamps   how many windows validation and test hold
#   remove_columns        [[table, column], ...] a model must never see: add any column the
#                         label is computed from or implied by
# Train seed times step back from val_timestamp - timedelta by timedelta; validation starts at
# val_timestamp and test at test_timestamp (manifest.yaml one folder up): RelBench needs at
# least 3 training seed times and both windows inside the data.
# This example:
"""


def _example_task(
    folder: Path, frames: Mapping[str, pl.DataFrame], keys: Mapping[str, TableKeys], days: int
) -> str | None:
    """Write ``tasks/example-task/manifest.yaml`` (child rows per parent in the next window)."""
    from relbench.manifest import TaskManifest

    pairs = [
        (child, fk, parent)
        for child, ck in keys.items()
        if ck.time_col is not None
        for fk, parent in ck.fkeys.items()
        if keys[parent].pkey is not None
    ]
    if not pairs:
        return None
    # a parent with no time column first: a lasting entity (a customer, a user) with events
    child, fk, parent = min(pairs, key=lambda p: keys[p[2]].time_col is not None)
    pk, time = cast(str, keys[parent].pkey), cast(str, keys[child].time_col)
    target = f"{child}_next"
    description = (
        f"how many '{child}' rows each '{parent}' has in the {days} days after the seed "
        f"time, for every '{parent}' with at least one '{child}' row at or before it."
    )
    c, p = _quoted(child), _quoted(parent)
    sql = f"""
        SELECT
            t.timestamp,
            p.{_quoted(pk)},
            CAST((
                SELECT COUNT(*) FROM {c} c
                WHERE c.{_quoted(fk)} = p.{_quoted(pk)}
                  AND c.{_quoted(time)} > t.timestamp
                  AND c.{_quoted(time)} <= t.timestamp + INTERVAL '{{timedelta}}'
            ) AS DOUBLE) AS {_quoted(target)}
        FROM timestamps t, {p} p
        WHERE EXISTS (
            SELECT 1 FROM {c} c
            WHERE c.{_quoted(fk)} = p.{_quoted(pk)} AND c.{_quoted(time)} <= t.timestamp
        )
    """
    path = folder / "tasks" / EXAMPLE_TASK / "manifest.yaml"
    TaskManifest(
        name=EXAMPLE_TASK,
        kind="forecast",
        task_type="regression",
        description=description,
        entity_table=parent,
        entity_col=pk,
        target_col=target,
        time_col="timestamp",
        timedelta=f"{days} days",
        num_eval_timestamps=1,
        sql=sql,
    ).save(path)
    about = textwrap.fill(description, width=94, initial_indent="# ", subsequent_indent="#   ")
    path.write_text(_EXAMPLE_HEADER + about + "\n" + path.read_text())
    return description


def _quoted(name: str) -> str:
    """``name`` as a DuckDB identifier: bare when it is a plain name, else double-quoted."""
    return name if re.fullmatch(r"[a-z_][a-z0-9_]*", name) else '"' + name.replace('"', '""') + '"'


# --- the command's logic ----------------------------------------------------------------------


def read_table(path: Path) -> pl.DataFrame:
    """A Parquet or CSV file as a DataFrame (CSV: types inferred over the whole file, dates parsed)."""
    if not path.is_file():
        raise UserError(f"table file '{path}' does not exist; pass Parquet or CSV files, one per table.")
    suffix = path.suffix.lower()
    if suffix not in READABLE:
        raise UserError(f"table file '{path}' is not Parquet or CSV ({', '.join(READABLE)}); convert it first.")
    try:
        if suffix == ".csv":
            return pl.read_csv(path, try_parse_dates=True, infer_schema_length=None)
        return pl.read_parquet(path)
    except Exception as err:  # noqa: BLE001 - any reader error is a bad file the user can fix
        raise UserError(f"table file '{path}' could not be read: {err}") from None


def infer_keys(frames: Mapping[str, pl.DataFrame]) -> dict[str, TableKeys]:
    """Primary key, time column and foreign keys of every table (see the module docstring)."""
    pkeys = {t: infer_pkey(t, df) for t, df in frames.items()}
    return {
        t: TableKeys(pkey=pkeys[t], time_col=infer_time_col(df), fkeys=infer_fkeys(t, df, pkeys, frames))
        for t, df in frames.items()
    }


def write_starter(out: Path, table_files: Sequence[Path], name: str | None = None) -> StarterResult:
    """Write a starter RelBench folder at ``out`` from ``table_files`` (one table per file,
    named by its file's stem). Refuses an ``out`` that exists and files it cannot read."""
    out = Path(out)
    if out.exists():
        raise UserError(f"'{out}' already exists; name a new folder for the RelBench dataset, or remove it.")
    if not table_files:
        raise UserError("no table files given; pass one Parquet or CSV file per table.")
    names = [Path(p).stem for p in table_files]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UserError(f"two table files share the name {dup}: a table is named by its file's stem; rename one.")
    frames = {n: normalise_types(read_table(Path(p))) for n, p in zip(names, table_files, strict=True)}
    keys = infer_keys(frames)
    notes = _notes(frames, keys)
    frames, keys, renamed = _python_time_names(frames, keys)
    notes += renamed

    times = _all_times(frames, keys)
    if times.len():
        val, test = _quantile_time(times, VAL_QUANTILE), _quantile_time(times, TEST_QUANTILE)
        val_s, test_s = _iso(val), _iso(test)
        days = _example_window_days(times, val, test)
    else:
        val_s, test_s, days = "2000-01-01", "2001-01-01", 0
        notes.append(
            "no table has a date or timestamp column: val_timestamp/test_timestamp are placeholders and "
            "no forecast task can be anchored in time until one does."
        )

    tables, keymaps = apply_key_contract(frames, keys)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    with interrupts.removed_on_exit(lambda: shutil.rmtree(tmp, ignore_errors=True)):
        write_db(tmp, tables, keymaps)
        manifest = dataset_manifest(
            name or out.name,
            val_s,
            test_s,
            keys,
            "Starter written by relflow-bench relbench-init: check the keys, time columns and timestamps.",
        )
        manifest.save(tmp / "manifest.yaml")  # type: ignore[attr-defined]
        example = _example_task(tmp, frames, keys, days) if days >= 1 else None
        if example is None:
            notes.append(
                "no example task written (it needs a table with a time column and a foreign key, and room "
                "for at least a one-day window): add tasks/<name>/manifest.yaml yourself."
            )
        if out.exists():
            raise UserError(f"'{out}' appeared while the starter was written; nothing was changed.")
        tmp.rename(out)
    return StarterResult(
        folder=out,
        tables=keys,
        rows={t: df.height for t, df in frames.items()},
        val_timestamp=val_s,
        test_timestamp=test_s,
        example_task=EXAMPLE_TASK if example is not None else None,
        notes=notes,
    )


def _python_time_names(
    frames: Mapping[str, pl.DataFrame], keys: Mapping[str, TableKeys]
) -> tuple[dict[str, pl.DataFrame], dict[str, TableKeys], list[str]]:
    """Rename a time column whose name is no Python identifier: RelBench 3.0.2 cuts tables at a
    time with ``DataFrame.query(f"{time_col} <= @timestamp")``, which fails on such a name
    (``SyntaxError``) in ``get_db``."""
    out_frames, out_keys, notes = dict(frames), dict(keys), []
    for t, k in keys.items():
        col = k.time_col
        if col is None or (col.isidentifier() and not keyword.iskeyword(col)):
            continue
        new = re.sub(r"\W", "_", col)
        if not new.isidentifier() or keyword.iskeyword(new):
            new = f"t_{new}"
        while new in frames[t].columns:
            new += "_"
        out_frames[t] = frames[t].rename({col: new})
        out_keys[t] = TableKeys(pkey=k.pkey, time_col=new, fkeys=dict(k.fkeys))
        notes.append(
            f"'{t}': time column '{col}' renamed '{new}' (RelBench filters by time with pandas' "
            "DataFrame.query, which needs a Python name)."
        )
    return out_frames, out_keys, notes


def _notes(frames: Mapping[str, pl.DataFrame], keys: Mapping[str, TableKeys]) -> list[str]:
    notes = []
    for t, k in keys.items():
        df = frames[t]
        if _quoted(t) != t:
            notes.append(f"table '{t}' is not a plain SQL name: quote it ({_quoted(t)}) in task SQL.")
        if k.pkey is None:
            notes.append(f"'{t}': no primary key found (a unique non-null id/key column); fine for an event table.")
        if k.time_col is None:
            notes.append(f"'{t}': no time column: its rows are visible at every seed time.")
        elif df[k.time_col].null_count():
            notes.append(
                f"'{t}': {df[k.time_col].null_count():,} rows have no {k.time_col}: RelBench drops them at every "
                "time cut, so no model sees them."
            )
        others = [c for c in df.columns if c.lower().endswith(("key", "_id")) and c != k.pkey and c not in k.fkeys]
        if others:
            notes.append(f"'{t}': {others} look like keys but match no table's primary key: add fkeys by hand.")
    return notes


def describe(result: StarterResult) -> list[str]:
    """What the command prints: the inferred keys per table, the timestamps, what to check."""
    lines = [f"RelBench starter written to {result.folder}"]
    for t, k in result.tables.items():
        fk = ", ".join(f"{c} -> {p}" for c, p in k.fkeys.items()) or "none"
        lines.append(f"  {t} ({result.rows[t]:,} rows): pkey {k.pkey}, time_col {k.time_col}, fkeys {fk}")
    lines.append(
        f"  val_timestamp {result.val_timestamp}, test_timestamp {result.test_timestamp} "
        f"(placeholders: the {VAL_QUANTILE:.0%} and {TEST_QUANTILE:.0%} quantiles of every time value)"
    )
    if result.example_task:
        lines.append(f"  tasks/{result.example_task}/manifest.yaml: an example forecast task to rewrite")
    lines.append("Check before use:")
    lines += [f"  - {n}" for n in result.notes]
    lines.append(
        "  - primary keys were re-indexed to 0..N-1 (RelBench requires it) and foreign keys remapped; "
        "keymap/<table>.parquet maps the original keys to the new ones."
    )
    lines.append("  - edit manifest.yaml (keys, time columns, val/test timestamps) and the task manifests.")
    return lines
