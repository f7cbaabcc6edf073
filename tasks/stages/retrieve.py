"""Stage 1, retrieve: read the rows of one chunk of root keys, and only the needed columns.

Projection pushdown: each table is read with just the columns the schema names. Row
selection walks the schema top-down: the root rows of the chunk, then each branch's rows
whose ``parent_key`` is among the parent rows just read. Parquet row groups whose key
statistics cannot overlap the wanted keys are skipped, and every row group is filtered as
it is read, so memory holds one row group plus the kept rows, not the whole table; a row
group every row of which is wanted is kept as read (``filter`` would copy it whole).

Category columns stored as strings in Parquet are read dictionary-encoded (``read_dictionary``):
the file already holds them as a dictionary page plus indices, so no string is materialised
per cell, Polars carries them as ``Categorical`` (a u32 per cell), and tensorize hashes each
distinct value once instead of every cell. Where a chunk keeps fewer rows than its dictionary
has values (a request's few rows), they are decoded back to plain strings, so a request never
pays for a whole row group's dictionary downstream.

``bytes_read`` is exact for what was read: the compressed size of the projected column
chunks of the row groups read (Parquet), the projected buffers (Arrow IPC), the whole
file (CSV, which has no projection at the storage level), or the Arrow bytes of the query
result (a database, ``tasks.sources.databases``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from tasks.sources.databases import DatabaseTable
from tasks.sources.files import SourceTable
from tasks.sources.tables import Sources, Table
from tasks.spec import Spec

ROOT = "root"


@dataclass
class Retrieved:
    tables: dict[str, pa.Table]  # node name ("root" or branch name) -> rows of this chunk
    bytes_read: int
    root_rows: int
    rows_read: dict[str, int] = field(default_factory=dict)


def node_columns(spec: Spec) -> dict[str, list[str]]:
    """Columns each node needs from its table: keys, ordering, inputs, target."""
    root = spec.schema_.root
    roles = [c for c in (root.entity, root.seed_time, root.split) if c is not None]
    out: dict[str, list[str]] = {ROOT: [root.key, *roles, *root.columns]}
    for branch, _ in spec.schema_.walk():
        cols = [branch.parent_key]
        if branch.key:
            cols.append(branch.key)
        if branch.order_by:
            cols.append(branch.order_by.column)
        if branch.time and spec.schema_.as_of:
            cols.append(branch.time)
        out[branch.name] = cols + list(branch.columns)
    out[spec.task.branch or ROOT].append(spec.task.target)
    return {k: list(dict.fromkeys(v)) for k, v in out.items()}


def category_columns(spec: Spec) -> dict[str, list[str]]:
    """Input columns of kind ``category`` per node (read dictionary-encoded where stored as text)."""
    out: dict[str, list[str]] = {ROOT: [c for c, k in spec.schema_.root.columns.items() if k == "category"]}
    for branch, _ in spec.schema_.walk():
        out[branch.name] = [c for c, k in branch.columns.items() if k == "category"]
    return out


def dictionary_columns(schema: pa.Schema, categories: Collection[str]) -> list[str]:
    """Which of ``categories`` a Parquet file stores as text, so ``read_dictionary`` applies."""
    text = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view, pa.types.is_binary)
    return [c for c in categories if c in schema.names and any(t(schema.field(c).type) for t in text)]


def _overlaps(stats: Any, lo: Any, hi: Any) -> bool:
    if stats is None or not stats.has_min_max:
        return True
    try:
        return not (stats.max < lo or stats.min > hi)
    except TypeError:
        return True


def _plain_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_dictionary(t):
        return pa.dictionary(t.index_type, _plain_type(t.value_type))
    return t


def _plain(table: pa.Table) -> pa.Table:
    """View types (string_view, binary_view, also as dictionary values) -> plain ones, which
    every kernel accepts."""
    schema = pa.schema([f.with_type(_plain_type(f.type)) for f in table.schema])
    return table if schema.equals(table.schema) else table.cast(schema)


# Row groups held unfiltered before their keys are tested together: one hash build of the
# chunk's keys per this many bytes read, instead of one per row group, and at most this much
# more memory than filtering each row group as it arrives (a key-unsorted table, whose row
# groups all overlap every chunk, is never held whole).
PENDING_BYTES = 128 * 2**20


def _kept_together(parts: list[pa.Table], key: str, keys: pa.Array) -> list[pa.Table]:
    """Each part's rows whose ``key`` is in ``keys``, by one ``is_in`` over every part's key
    column: Arrow builds its hash set of ``keys`` on every call, and once per row group that
    build was most of retrieve (about 15 ms per row group at 150,000 keys, eight row groups at
    TPC-H scale 0.1). A part every row of which is wanted is kept as read (the one-chunk
    default, and whole row groups inside a chunk's key range), since ``filter`` copies every
    column even when it drops nothing."""
    if not parts:
        return []
    column = pa.chunked_array([c for p in parts for c in p[key].chunks], type=parts[0].schema.field(key).type)
    mask = pc.is_in(column, value_set=keys)  # a null key matches nothing: False, never null
    out, start = [], 0
    for part in parts:
        m = mask.slice(start, part.num_rows)
        start += part.num_rows
        out.append(part if pc.all(m).as_py() is not False else part.filter(m))
    return out


def _kept(parts: Iterable[pa.Table], key: str, keys: pa.Array) -> list[pa.Table]:
    """``_kept_together`` over the parts as they are read, ``PENDING_BYTES`` at a time."""
    out: list[pa.Table] = []
    pending: list[pa.Table] = []
    held = 0
    for part in parts:
        pending.append(part)
        held += part.nbytes
        if held >= PENDING_BYTES:
            out += _kept_together(pending, key, keys)
            pending, held = [], 0
    return out + _kept_together(pending, key, keys)


def _read_parquet(
    src: SourceTable, columns: list[str], key: str, keys: pa.Array, categories: Collection[str]
) -> tuple[pa.Table, int]:
    lo, hi = pc.min(keys).as_py(), pc.max(keys).as_py()
    nbytes = 0
    dictionary = dictionary_columns(src.schema, categories)  # the table's schema: once, not per file

    def row_groups() -> Iterator[pa.Table]:
        nonlocal nbytes
        for path in src.files:
            pf = pq.ParquetFile(path, read_dictionary=dictionary)
            meta = pf.metadata
            names = pf.schema_arrow.names
            key_idx = names.index(key)
            wanted = {names.index(c) for c in columns}
            for rg in range(meta.num_row_groups):
                rgm = meta.row_group(rg)
                if not _overlaps(rgm.column(key_idx).statistics, lo, hi):
                    continue
                nbytes += sum(rgm.column(i).total_compressed_size for i in wanted)
                yield _plain(pf.read_row_group(rg, columns=columns))

    kept = _kept(row_groups(), key, keys)  # reads every overlapping row group: nbytes is final
    return _concat(kept, columns, src), nbytes


def _read_ipc(
    src: SourceTable, columns: list[str], key: str, keys: pa.Array, categories: Collection[str]
) -> tuple[pa.Table, int]:
    nbytes = 0

    def batches() -> Iterator[pa.Table]:
        nonlocal nbytes
        for path in src.files:
            with pa.memory_map(str(path)) as f:
                reader = ipc.open_file(f)
                for i in range(reader.num_record_batches):
                    batch = reader.get_batch(i).select(columns)
                    nbytes += batch.nbytes
                    yield _plain(pa.Table.from_batches([batch]))

    kept = _kept(batches(), key, keys)
    return _concat(kept, columns, src), nbytes


def _read_csv(
    src: SourceTable, columns: list[str], key: str, keys: pa.Array, categories: Collection[str]
) -> tuple[pa.Table, int]:
    wanted = cast(pl.Series, pl.from_arrow(keys))
    # The settings and pinned column types of the up-front check (source.csv), so every
    # chunk reads the same types the check verified.
    frames = [src.scan_csv(p).select(columns).filter(pl.col(key).is_in(wanted.implode())) for p in src.files]
    nbytes = sum(p.stat().st_size for p in src.files)
    return _plain(pl.concat(frames).collect().to_arrow()), nbytes


def _concat(parts: list[pa.Table], columns: list[str], src: SourceTable) -> pa.Table:
    if not parts:
        schema = src.schema
        return _plain(pa.schema([schema.field(c) for c in columns]).empty_table())
    return _small_dictionaries_decoded(pa.concat_tables(parts).combine_chunks())


def _small_dictionaries_decoded(table: pa.Table) -> pa.Table:
    """Dictionary columns with fewer rows than dictionary values as plain values: hashing the
    dictionary would cost more than the cells (a request's few rows of a row group)."""
    for i, f in enumerate(table.schema):
        if pa.types.is_dictionary(f.type) and table.num_rows:
            col = table.column(i)
            if len(col.chunk(0).dictionary) > table.num_rows:  # one chunk: after combine_chunks
                table = table.set_column(i, f.name, col.cast(f.type.value_type))
    return table


READERS = {"parquet": _read_parquet, "ipc": _read_ipc, "csv": _read_csv}


def read_rows(
    src: Table, columns: list[str], key: str, keys: pa.Array, categories: Collection[str] = ()
) -> tuple[pa.Table, int]:
    """Rows of ``src`` whose ``key`` is in ``keys``, projected to ``columns``; ``categories``
    (a subset of ``columns``) are read dictionary-encoded where the source stores them so."""
    if isinstance(src, DatabaseTable):  # SQL with the keys bound as parameters
        return src.read(columns, key, keys)
    return READERS[src.format](src, columns, key, keys, categories)


def list_root_keys(spec: Spec, sources: Sources) -> tuple[np.ndarray, int]:
    """All root keys, sorted (contiguous chunks prune row groups of key-sorted tables)."""
    root = spec.schema_.root
    src = sources[root.table]
    if isinstance(src, DatabaseTable):
        arr, nbytes = src.distinct(root.key)
        return arr.to_numpy(zero_copy_only=False), nbytes
    if src.format == "csv":
        keys = pl.concat([src.scan_csv(p).select(root.key) for p in src.files]).collect().to_series()
        nbytes = sum(p.stat().st_size for p in src.files)
        arr = keys.to_numpy()
    else:
        if src.format == "parquet":
            # ParquetFile.read, not pq.read_table: read_table imports pyarrow.dataset on first
            # use (0.2-0.35 s here), which a predict-only run paid inside predict's retrieve
            parts, nbytes = [], 0
            for p in src.files:  # each file opened (its footer read) once, one open at a time
                with pq.ParquetFile(p) as f:
                    parts.append(f.read(columns=[root.key]))
                    meta = f.metadata
                idx = meta.schema.to_arrow_schema().names.index(root.key)
                nbytes += sum(meta.row_group(i).column(idx).total_compressed_size for i in range(meta.num_row_groups))
            table = pa.concat_tables(parts)
        else:
            table = pa.concat_tables(
                ipc.open_file(pa.memory_map(str(p))).read_all().select([root.key]) for p in src.files
            )
            nbytes = table.nbytes
        arr = table[root.key].to_numpy()
    return np.unique(arr), nbytes  # unique also sorts; duplicate root keys collapse


# A column stored with Arrow's null type (pandas writes an all-None column so) carries no
# type of its own: it is read as what the spec declares, all null.
NULL_COLUMN_TYPES: dict[str, pa.DataType] = {
    "numeric": pa.float64(),
    "timestamp": pa.timestamp("us"),
    "category": pa.string(),
    "text": pa.string(),
}


def _typed(table: pa.Table, kinds: Mapping[str, str]) -> pa.Table:
    """``table`` with each null-typed column of ``kinds`` cast to its declared kind's type."""
    fields = [
        f.with_type(NULL_COLUMN_TYPES[kinds[f.name]]) if pa.types.is_null(f.type) and f.name in kinds else f
        for f in table.schema
    ]
    schema = pa.schema(fields)
    return table if schema.equals(table.schema) else table.cast(schema)


def retrieve(spec: Spec, sources: Sources, root_keys: np.ndarray) -> Retrieved:
    """Read the chunk's root rows and, top-down, the branch rows that hang under them."""
    cols, cats = node_columns(spec), category_columns(spec)
    root = spec.schema_.root
    keys = pa.array(root_keys)
    tables: dict[str, pa.Table] = {}
    total = 0
    table, n = read_rows(sources[root.table], cols[ROOT], root.key, keys, cats[ROOT])
    tables[ROOT] = _typed(table, root.columns)
    total += n

    # Parents first (Schema.walk), so each branch's parent keys exist when it is read. Not a
    # recursive closure: that put the chunk's tables in a reference cycle, alive until the
    # cyclic garbage collector ran (579 MB of Arrow memory after 12 reads at scale 0.1).
    # the keys that each read node's branches hang under: a time-anchored root row's entity
    entities = keys if root.entity is None else pc.unique(tables[ROOT][root.entity])
    below: dict[str, pa.Array] = {ROOT: entities}
    for b, parent in spec.schema_.walk():
        table, n = read_rows(
            sources[b.table],
            cols[b.name],
            b.parent_key,
            below[parent or ROOT].cast(_key_type(sources[b.table], b.parent_key)),
            cats[b.name],
        )
        tables[b.name] = table = _typed(table, b.columns)
        total += n
        if b.branches:
            below[b.name] = pc.unique(table[b.key])
    return Retrieved(
        tables=tables,
        bytes_read=total,
        root_rows=tables[ROOT].num_rows,
        rows_read={k: v.num_rows for k, v in tables.items()},
    )


def _key_type(src: Table, column: str) -> pa.DataType:
    return src.schema.field(column).type
