"""A spec from a RelBench folder: ``source.relbench: {path, task}`` is enough.

RelBench's on-disk format is the task language (DESIGN.md section 3): ``manifest.yaml`` (tables,
primary keys, time columns, foreign keys; validation and test timestamps), ``db/<table>.parquet``
and ``tasks/<task>/manifest.yaml`` with stored ``{train,val,test}.parquet`` labels or the SQL that
makes them. The manifests are read with relbench's own classes; nothing is fetched.

``complete(raw, spec_dir)`` fills what the spec leaves out, before ``--set`` addresses branches:

- **root**: the task's rows, one per (entity, seed time): table ``<task>`` (materialized by
  tasks/sources/relbench.py), key ``seed_key`` (``"<entity>@<seed time>"``), ``entity`` the task's
  entity column, ``seed_time`` its time column, ``split`` the RelBench split of the row; the
  entity table's own columns are its inputs (keys and ``remove_columns`` left out, and text
  columns that look like identifiers: over ``MAX_CATEGORIES`` distinct values and over
  ``IDENTIFIER_SHARE`` of the rows of the file's first row group, e.g. names and comments).
- **branches**: every table with a foreign key to the entity table, newest rows first by its time
  column (``order_by`` descending, ``time`` set so the as-of rule applies), ``max_length``
  ``DEFAULT_MAX_LENGTH`` (``NESTED_MAX_LENGTH`` one hop further down), ``overflow: keep_first``
  (so the most recent rows are kept), ``reduce: mean``; one hop down, every table with a foreign
  key to a branch table becomes its nested branch.
- **task**: the target column; ``binary_classification`` -> binary, ``regression`` -> regression,
  ``multiclass_classification`` -> category; other task types are refused (exit 2).

A ``schema:`` or ``task:`` in the spec is kept as written (validated as usual).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.runtime.errors import UserError

SEED_KEY = "seed_key"  # "<entity>@<seed time>": the root key of a time-anchored task
SPLIT = "relbench_split"  # 'train' | 'val' | 'test' per root row
DEFAULT_MAX_LENGTH = 8  # rows per entity of a top-level branch (the most recent ones)
NESTED_MAX_LENGTH = 4  # rows per parent row one hop further down
SPLITS = ("train", "val", "test")
# A text column is left out as an identifier when it has more distinct values than this, and
# more than IDENTIFIER_SHARE of its rows, in its file's first row group.
MAX_CATEGORIES = 1000
IDENTIFIER_SHARE = 0.5

TASK_KINDS = {"binary_classification": "binary", "regression": "regression", "multiclass_classification": "category"}


@dataclass(frozen=True)
class Folder:
    """A RelBench dataset folder and one task, their manifests read."""

    path: Path
    task: str
    manifest: Any  # relbench.manifest.DatasetManifest (an external type)
    task_manifest: Any  # relbench.manifest.TaskManifest

    @property
    def entity_table(self) -> str:
        return str(self.task_manifest.entity_table)

    def removed(self, table: str) -> set[str]:
        return {str(c) for t, c in (self.task_manifest.remove_columns or []) if t == table}


def resolve_path(source: dict[str, Any], spec_dir: Path) -> Path:
    """The dataset folder of ``source.relbench`` (a raw or dumped ``source`` mapping)."""
    rb = source["relbench"]
    path = Path(str(rb["path"])).expanduser()
    if path.is_absolute():
        return path
    generate = (source.get("generate") or {}).get("tpch")
    if generate is None:
        return (spec_dir / path).resolve()
    from tasks.datasets.tpch import ensure_tpch

    home, _ = ensure_tpch(float(generate.get("scale", 0.01)))
    if path == Path("rel-tpch"):  # the shipped time-anchored workload, built from the generated TPC-H
        from tasks.datasets.relbench_tpch import ensure_rel_tpch

        return ensure_rel_tpch(home)
    return home / path


def open_folder(path: Path, task: str) -> Folder:
    """The folder's manifests, every file a run needs checked first (exit 2 naming the file)."""
    from relbench.manifest import DatasetManifest, TaskManifest

    def need(p: Path, what: str, fix: str) -> None:
        if not p.is_file():
            raise UserError(f"source.relbench: {what} '{p}' does not exist; {fix}.")

    if not path.is_dir():
        raise UserError(
            f"source.relbench.path '{path}' is not a folder; point it at a RelBench dataset folder "
            "(holding manifest.yaml, db/ and tasks/), or write one with 'relflow-bench relbench-init'."
        )
    need(
        path / "manifest.yaml",
        "the dataset manifest",
        "a RelBench folder starts with one (relflow-bench relbench-init writes a starter)",
    )
    manifest = DatasetManifest.load(path / "manifest.yaml")
    tasks_dir = path / "tasks"
    names = sorted(d.name for d in tasks_dir.iterdir() if (d / "manifest.yaml").is_file()) if tasks_dir.is_dir() else []
    if task not in names:
        raise UserError(
            f"source.relbench.task '{task}' has no manifest at '{tasks_dir / task / 'manifest.yaml'}'; "
            f"the folder's tasks are {names or '(none)'}: set source.relbench.task to one of them."
        )
    tm = TaskManifest.load(tasks_dir / task / "manifest.yaml")
    try:
        tm.validate()
    except ValueError as err:
        raise UserError(f"source.relbench task manifest '{tasks_dir / task / 'manifest.yaml'}': {err}.") from None
    for name in manifest.tables:
        need(
            path / "db" / f"{name}.parquet",
            f"table '{name}' of manifest.yaml",
            "copy the table there or remove it from manifest.yaml",
        )
    stored = [s for s in SPLITS if (tasks_dir / task / f"{s}.parquet").is_file()]
    if len(stored) < len(SPLITS) and not tm.sql:
        missing = [f"{s}.parquet" for s in SPLITS if s not in stored]
        raise UserError(
            f"source.relbench task '{task}' stores no {missing} and its manifest has no 'sql' to make them; "
            f"add the files under '{tasks_dir / task}' or a forecast 'sql' to its manifest."
        )
    for name, t in manifest.tables.items():
        if t.time_col and not str(t.time_col).isidentifier():
            # relbench 3.0.2 cuts tables with DataFrame.query(f"{time_col} <= @timestamp")
            raise UserError(
                f"source.relbench: table '{name}' has time_col '{t.time_col}', which relbench 3.0.2 cannot "
                "filter by (it must be a Python identifier: letters, digits, '_'); rename the column in "
                f"db/{name}.parquet and manifest.yaml (relflow-bench relbench-init does so)."
            )
    for name, t in manifest.tables.items():
        dtype = _column_type(path / "db" / f"{name}.parquet", t.time_col)
        if dtype is not None and pa.types.is_timestamp(dtype) and dtype.tz is not None:
            raise UserError(
                f"source.relbench: table '{name}' stores time_col '{t.time_col}' with time zone {dtype.tz}; "
                "relbench 3.0.2 compares it with naive timestamps and fails. Store it as naive UTC "
                f"(pandas: .dt.tz_convert('UTC').dt.tz_localize(None)) in db/{name}.parquet."
            )
    if tm.entity_table not in manifest.tables:
        raise UserError(
            f"source.relbench task '{task}': entity_table '{tm.entity_table}' is not a table of manifest.yaml; "
            f"use one of {sorted(manifest.tables)}."
        )
    return Folder(path, task, manifest, tm)


def _column_type(path: Path, column: str | None) -> pa.DataType | None:
    if column is None:
        return None
    schema = pq.read_schema(path)
    if column not in schema.names:
        raise UserError(
            f"source.relbench: manifest.yaml names column '{column}' of '{path.name}', which has columns "
            f"{schema.names}; fix manifest.yaml."
        )
    return schema.field(column).type


def column_kind(dtype: pa.DataType) -> str | None:
    """A column's kind from its Arrow type (None: not an input: nested, binary, null)."""
    if pa.types.is_boolean(dtype) or pa.types.is_dictionary(dtype):
        return "category"
    if pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_decimal(dtype):
        return "numeric"
    if pa.types.is_timestamp(dtype) or pa.types.is_date(dtype):
        return "timestamp"
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or pa.types.is_string_view(dtype):
        return "category"
    return None


def _identifiers(path: Path, columns: list[str]) -> set[str]:
    """Text columns whose values are nearly all distinct in the first row group (names, phone
    numbers, free-text comments): as categories they would be one class per row."""
    if not columns:
        return set()
    f = pq.ParquetFile(path)
    if f.metadata.num_row_groups == 0:
        return set()
    sample = f.read_row_group(0, columns=columns)
    out = set()
    for c in columns:
        n = sample.num_rows - sample[c].null_count
        if n and len(pc.unique(sample[c])) > max(MAX_CATEGORIES, IDENTIFIER_SHARE * n):
            out.add(c)
    return out


def _inputs(folder: Folder, table: str, exclude: set[str]) -> dict[str, str]:
    spec = folder.manifest.tables[table]
    keys = {spec.pkey, *spec.fkeys} - {None}
    path = folder.path / "db" / f"{table}.parquet"
    schema = pq.read_schema(path)
    out = {}
    for f in schema:
        kind = column_kind(f.type)
        if f.name in keys or f.name in exclude or f.name in folder.removed(table) or kind is None:
            continue
        out[f.name] = kind
    text = [c for c, k in out.items() if k == "category" and not pa.types.is_boolean(schema.field(c).type)]
    for c in _identifiers(path, text):
        del out[c]
    return out


def derive_schema(folder: Folder) -> dict[str, Any]:
    """The ``schema:`` section a RelBench task implies (module docstring)."""
    tm, tables = folder.task_manifest, folder.manifest.tables
    entity = folder.entity_table
    task_cols = {tm.entity_col, tm.time_col, tm.target_col, SEED_KEY, SPLIT}
    ent_time = tables[entity].time_col
    root = {
        "table": folder.task,
        "key": SEED_KEY,
        "entity": tm.entity_col,
        "seed_time": tm.time_col,
        "split": SPLIT,
        "columns": _inputs(folder, entity, task_cols | ({ent_time} if ent_time else set())),
    }
    used = {entity}
    names: set[str] = {"root"}

    def branch(table: str, fkey: str, max_length: int) -> dict[str, Any]:
        spec = tables[table]
        name = table if table not in names else f"{table}_{fkey}"
        names.add(name)
        b: dict[str, Any] = {"name": name, "table": table, "parent_key": fkey}
        if spec.pkey:
            b["key"] = spec.pkey
        if spec.time_col:
            b["order_by"] = {"column": spec.time_col, "descending": True}
            b["time"] = spec.time_col
        b |= {"max_length": max_length, "overflow": "keep_first", "reduce": "mean"}
        b["columns"] = _inputs(folder, table, set())
        return b

    def children(parent: str) -> list[tuple[str, str]]:
        return sorted(
            (t, col) for t, s in tables.items() for col, to in s.fkeys.items() if to == parent and t != parent
        )

    top = []
    for table, fkey in children(entity):
        b = branch(table, fkey, DEFAULT_MAX_LENGTH)
        used.add(table)
        top.append((b, table))
    for b, table in top:
        if not tables[table].pkey:
            continue  # nothing can point at a table without a primary key
        nested = [branch(t, fk, NESTED_MAX_LENGTH) for t, fk in children(table) if t not in used]
        if nested:
            b["branches"] = nested
    return {"root": root, "branches": [b for b, _ in top]}


def derive_task(folder: Folder) -> dict[str, Any]:
    tm = folder.task_manifest
    kind = TASK_KINDS.get(tm.task_type)
    if kind is None:
        raise UserError(
            f"source.relbench task '{folder.task}' is a {tm.task_type} task; the harness runs "
            f"{', '.join(TASK_KINDS)} tasks (entity tasks with one label per row): choose another task."
        )
    if tm.kind not in ("forecast", "autocomplete", "external") or not tm.entity_col:
        raise UserError(f"source.relbench task '{folder.task}': only entity tasks (entity_col set) run here.")
    return {"target": tm.target_col, "kind": kind, "outputs": ["prediction"]}


def complete(raw: dict[str, Any], spec_dir: Path) -> dict[str, Any]:
    """``raw`` with ``schema:`` and ``task:`` derived from ``source.relbench`` where absent."""
    source = raw.get("source")
    if not isinstance(source, dict) or not isinstance(source.get("relbench"), dict):
        return raw
    rb = source["relbench"]
    if "path" not in rb or "task" not in rb:
        return raw  # validation names the missing key
    folder = open_folder(resolve_path(source, spec_dir), str(rb["task"]))
    out = dict(raw)
    if "schema" not in out:
        out["schema"] = derive_schema(folder)
    if "task" not in out:
        out["task"] = derive_task(folder)
    return out
