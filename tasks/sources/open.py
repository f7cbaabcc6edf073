"""Where a spec's tables come from: one function for every process that reads them.

The flow (after its checks), each DDP rank and the benchmark scripts open a spec's sources
the same way: generated TPC-H data made available when the spec asks for it, then either the
database (``source.database``: DuckDB embedded, PostgreSQL) or the files. A rank that opened
files while the flow read a database once trained on other rows than it predicted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tasks.datasets.tpch import ensure_tpch
from tasks.sources.databases import DatabaseTable, kind_of, resolve_database
from tasks.sources.files import resolve_sources
from tasks.sources.relbench import db_tables, folder_of, task_rows
from tasks.sources.tables import Sources
from tasks.spec import Spec


@dataclass
class DataHome:
    """The folder relative file paths resolve from, and whether its data was generated now."""

    base: Path
    generated: bool = False


def data_home(spec: Spec, spec_dir: Path) -> DataHome:
    """Generated TPC-H data is made available (once per scale) unless a server database holds it."""
    db = spec.source.database
    if spec.source.generate is not None and (db is None or kind_of(db.url) == "duckdb"):
        base, generated = ensure_tpch(spec.source.generate.tpch.scale)
        return DataHome(base, generated)
    return DataHome(spec_dir)


def open_database(
    spec: Spec, spec_dir: Path, home: DataHome, tables: list[str] | None = None
) -> dict[str, DatabaseTable]:
    return resolve_database(spec, spec_dir, home.base if spec.source.generate else None, tables)


def open_relbench(spec: Spec, spec_dir: Path, home: DataHome) -> tuple[Sources, float]:
    """A RelBench folder's tables (from ``db/``, or ``source.database`` when set) and its task's
    rows as the root table (tasks/sources/relbench.py); the seconds spent writing those rows."""
    folder = folder_of(spec, spec_dir)
    tables = db_tables(spec, folder)
    sources: Sources
    if spec.source.database is not None:
        sources = dict(open_database(spec, spec_dir, home, list(tables)))
    else:
        sources = dict(resolve_sources(spec, home.base, {t: str(p) for t, p in tables.items()}))
    rows = task_rows(spec, folder, sources[folder.entity_table])
    return {**sources, spec.schema_.root.table: rows.table}, rows.seconds


def open_sources(spec: Spec, spec_dir: Path) -> Sources:
    """The spec's tables, opened (the flow's ``plan`` adds its checks around the same calls)."""
    home = data_home(spec, spec_dir)
    if spec.source.relbench is not None:
        return open_relbench(spec, spec_dir, home)[0]
    if spec.source.database is not None:
        return dict(open_database(spec, spec_dir, home))
    return dict(resolve_sources(spec, home.base))
