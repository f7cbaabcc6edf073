"""A RelBench folder as sources: its tables, and its task's rows as the root table.

The task's rows are what relbench 3.0.2 returns for each split (``task.get_table(split,
mask_input_cols=False)``: the stored ``{train,val,test}.parquet`` when present, else the
manifest's SQL run by DuckDB), one row per (entity, seed time) with its label. They are written
once to a Parquet file under ``$RELFLOW_DATA_DIR/relbench-rows/`` (a digest of the task's files,
the entity table's and the columns taken in its name; written to a temporary file and renamed,
so an interrupted run leaves nothing a rerun trusts) with:

- ``seed_key`` (``"<entity>@<YYYY-MM-DDTHH:MM:SS>"``): the root key, unique per row;
- the entity column, the seed time column (microseconds), the target, ``relbench_split``;
- the entity table's input columns, joined by the entity key; where the entity table has a time
  column, an entity that appears after the row's seed time has them null (nothing after the seed
  time reaches a model). With ``source.database`` the entity table is read from the database.

The file is sorted by ``seed_key`` (contiguous chunks of keys prune its row groups). The seconds
it took to write are stored in its metadata and returned (``TaskRows.seconds``, logged as
``relbench.task_rows_seconds``, in no stage: it is data preparation, like generating TPC-H); a
rerun reads the file back in milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.datasets.tpch import data_dir
from tasks.measure.clock import wall_clock
from tasks.runtime.errors import UserError
from tasks.sources.databases import DatabaseTable, quote
from tasks.sources.files import SourceTable
from tasks.sources.tables import Sources, Table
from tasks.spec import Spec
from tasks.spec.relbench import SEED_KEY, SPLIT, SPLITS, Folder, open_folder, resolve_path

BUILD_SECONDS = "relflow.build_seconds"  # Parquet metadata: seconds the file took to write
ROWS_FORMAT = 2  # bump when the file's layout changes: the digest then misses old files


@dataclass(frozen=True)
class TaskRows:
    table: SourceTable
    seconds: float  # the file took to write (relbench's get_table per split and the join), whenever written


def folder_of(spec: Spec, spec_dir: Path) -> Folder:
    assert spec.source.relbench is not None
    return open_folder(resolve_path(spec.source.model_dump(mode="json"), spec_dir), spec.source.relbench.task)


def db_tables(spec: Spec, folder: Folder) -> dict[str, Path]:
    """The dataset's tables the spec reads (every node but the root, and the entity table)."""
    used = {b.table for b, _ in spec.schema_.walk()} | {folder.entity_table}
    unknown = sorted(used - set(folder.manifest.tables))
    if unknown:
        raise UserError(
            f"schema names table(s) {unknown} that manifest.yaml of '{folder.path}' does not list; use one of "
            f"{sorted(folder.manifest.tables)}."
        )
    return {t: folder.path / "db" / f"{t}.parquet" for t in sorted(used)}


def check_root(spec: Spec, folder: Folder) -> None:
    """A spec over a RelBench folder keeps the task's rows as its root (a written schema too)."""
    root, tm = spec.schema_.root, folder.task_manifest
    want = {
        "table": folder.task,
        "key": SEED_KEY,
        "entity": tm.entity_col,
        "seed_time": tm.time_col,
        "split": SPLIT,
    }
    wrong = {k: v for k, v in want.items() if getattr(root, k) != v}
    if wrong:
        raise UserError(
            f"With source.relbench the root is the task's rows: set schema.root {wrong} (or leave schema out and "
            "let it be derived)."
        )
    removed = {(t, c) for t, c in (tm.remove_columns or [])}
    used = [(folder.entity_table, c) for c in root.columns] + [
        (b.table, c) for b, _ in spec.schema_.walk() for c in b.columns
    ]
    leaked = sorted(set(used) & removed)
    if leaked:
        raise UserError(
            f"task '{folder.task}' lists {leaked} in remove_columns (they imply its label), but the schema uses "
            "them as inputs; remove them from the schema's columns."
        )


def task_rows(spec: Spec, folder: Folder, entity: Table) -> TaskRows:
    """The task's rows as a Parquet source table (module docstring), written once."""
    check_root(spec, folder)
    path = _rows_path(spec, folder, entity)
    if not path.is_file():
        t0 = wall_clock()
        table = _build(spec, folder, entity)
        # the seconds it took travel with the file: a rerun (and the flow's second plan) reads them
        table = table.replace_schema_metadata({BUILD_SECONDS: f"{wall_clock() - t0:.6f}"})
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".rows-", suffix=".parquet", dir=path.parent)
        os.close(fd)
        try:
            pq.write_table(table, tmp, row_group_size=65_536)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    meta = pq.read_schema(path).metadata or {}
    seconds = float(meta.get(BUILD_SECONDS.encode(), b"nan"))
    return TaskRows(SourceTable(spec.schema_.root.table, (path,), "parquet"), seconds)


def _rows_path(spec: Spec, folder: Folder, entity: Table) -> Path:
    task_dir = folder.path / "tasks" / folder.task
    files = [folder.path / "manifest.yaml", *sorted(task_dir.iterdir())]
    if isinstance(entity, SourceTable):
        files += list(entity.files)
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    where = entity.files if isinstance(entity, SourceTable) else entity.files
    h.update(json.dumps([ROWS_FORMAT, sorted(spec.schema_.root.columns), [str(w) for w in where]]).encode())
    return data_dir() / "relbench-rows" / f"{folder.manifest.name}-{folder.task}-{h.hexdigest()[:16]}.parquet"


def _build(spec: Spec, folder: Folder, entity: Table) -> pa.Table:
    tm = folder.task_manifest
    ent_col, time_col, target = str(tm.entity_col), str(tm.time_col), str(tm.target_col)
    parts = []
    for split, df in _relbench_rows(folder).items():
        missing = [c for c in (ent_col, time_col, target) if c not in df.columns]
        if missing:
            raise UserError(
                f"task '{folder.task}' {split} rows lack column(s) {missing}; its manifest names entity_col "
                f"'{ent_col}', time_col '{time_col}', target_col '{target}'."
            )
        frame = pl.from_pandas(pd.DataFrame(df[[ent_col, time_col, target]]))
        parts.append(frame.with_columns(pl.lit(split).alias(SPLIT)))
    rows = pl.concat(parts, how="vertical_relaxed").with_columns(pl.col(time_col).cast(pl.Datetime("us")))
    rows = rows.with_columns(
        pl.format("{}@{}", pl.col(ent_col).cast(pl.String), pl.col(time_col).dt.strftime("%Y-%m-%dT%H:%M:%S")).alias(
            SEED_KEY
        )
    )
    dupes = rows.height - rows[SEED_KEY].n_unique()
    if dupes:
        raise UserError(
            f"task '{folder.task}' has {dupes:,} rows repeating an (entity, seed time) pair across or within its "
            "splits; a row is one entity at one seed time: deduplicate its tables."
        )
    rows = _with_entity_columns(spec, folder, entity, rows, ent_col, time_col)
    order = [SEED_KEY, ent_col, time_col, target, SPLIT]
    rows = rows.select(order + [c for c in rows.columns if c not in order]).sort(SEED_KEY)
    return rows.to_arrow()


def _relbench_rows(folder: Folder) -> dict[str, pd.DataFrame]:
    """Each split's rows as relbench returns them; its errors named with the folder and task."""
    from relbench.load import RelBenchDataset

    try:
        task = RelBenchDataset(folder.path).load_task(folder.task)
        return {split: task.get_table(split, mask_input_cols=False).df for split in SPLITS}
    except Exception as err:  # relbench's own failure on this folder: exit 2 with it named
        raise UserError(
            f"relbench 3.0.2 could not make the rows of task '{folder.task}' in '{folder.path}': "
            f"{type(err).__name__}: {err}. Fix the folder (its manifests, SQL or tables) so that "
            "relbench.load.RelBenchDataset(path).load_task(task).get_table(split) works."
        ) from err


def _with_entity_columns(
    spec: Spec, folder: Folder, entity: Table, rows: pl.DataFrame, ent_col: str, time_col: str
) -> pl.DataFrame:
    meta = folder.manifest.tables[folder.entity_table]
    cols = [c for c in spec.schema_.root.columns if c not in rows.columns]
    if not cols:
        return rows
    pkey, ent_time = meta.pkey, meta.time_col
    if pkey is None:
        raise UserError(f"entity table '{folder.entity_table}' has no pkey in manifest.yaml; add its key column.")
    read = [pkey, *cols, *([ent_time] if ent_time and ent_time not in cols else [])]
    attrs = read_all(entity, read)
    attrs = attrs.with_columns(pl.col(pkey).cast(rows.schema[ent_col])).unique(pkey, keep="first")
    out = rows.join(attrs.rename({pkey: ent_col}), on=ent_col, how="left", maintain_order="left")
    if ent_time:  # an entity that appears after the seed time: its columns are not known yet
        known = pl.col(ent_time).cast(pl.Datetime("us")) <= pl.col(time_col)
        out = out.with_columns(pl.when(known).then(pl.col(c)).otherwise(None).alias(c) for c in cols)
        if ent_time not in cols:
            out = out.drop(ent_time)
    return out


def read_all(src: Table, columns: list[str]) -> pl.DataFrame:
    """Every row of ``src``'s ``columns`` (files or a database table: one scan, so a row whose
    first column is null is read too)."""
    if isinstance(src, DatabaseTable):
        table = src.conform(src.db.query(f"SELECT {', '.join(quote(c) for c in columns)} FROM {quote(src.name)}"))
        return cast(pl.DataFrame, pl.from_arrow(table))
    if src.format == "csv":
        return pl.concat([src.scan_csv(p).select(columns) for p in src.files]).collect()
    if src.format == "ipc":
        return pl.concat([pl.read_ipc(p, columns=columns) for p in src.files])
    return pl.concat([pl.read_parquet(p, columns=columns) for p in src.files])


def with_task_rows(spec: Spec, spec_dir: Path, sources: Sources) -> tuple[Sources, float]:
    """``sources`` plus the task's rows as the root table (seconds spent writing them)."""
    folder = folder_of(spec, spec_dir)
    rows = task_rows(spec, folder, sources[folder.entity_table])
    return {**sources, spec.schema_.root.table: rows.table}, rows.seconds
