"""Contexts from relational-transformers-utils 0.1.0 over a foreign-key graph (``model.rt.context.
builder: rt_utils``): a RelBench folder's (``graph_tables``) or the spec's own schema's
(``spec_graph_tables``: the root's rows as the task, branches linked by ``parent_key``).

The ``nested`` builder (contexts.py) turns the harness's nested row (one root, its branches as
preprocess kept them) into one context. This module instead hands every table the spec reads,
and the task's rows, to the library's own pieces, the way its applications build contexts:

- ``ColumnarStore`` (the tables as NumPy columns, foreign keys resolved to node ids, one task
  table: one node per (entity, seed time) row, linked to its entity) and its ``ContextGraph``;
- ``ColumnarTraversal.traverse`` per target: breadth-first expansion and random walks both ways
  along the foreign keys, children admitted up to the anchor (the row's seed time), under the
  cell budget of ``model.rt.context`` (the library's ``ContextPolicy``). ``ContextTruncated`` is
  a ``UserError`` (exit 2) naming the budget key.

The library stops at node ids (``TraversalResult.node_ids``): it has no function from a context
to relational-transformers' ``RelationalBatch`` (its README: "no context-builder pipeline").
Cells are made here, columnar, from the emitted node ids (one cell per non-null declared value
of each emitted row, as the store's ``node_cells`` counts them; the same ``Contexts`` the nested
builder makes, so encode, the batch plan and ``collate`` are shared):

- node ids are the store's (unique across tables); each cell's parents are its row's foreign-key
  parents in the store (``f2p``, at most 5), whether or not they were emitted, as the library's
  own ``TraversalResult`` describes them;
- table ids follow the store's order, one column id per (table, column), names
  ``"<column> of <table>"``; the task table's target column is one column: the target's masked
  query cell, and the label cells of earlier task rows (peers) the walks admitted;
- **the anchor, enforced here as well** (findings in README.md): the library admits a row's
  foreign-key parents whatever their time, so a row after the seed time reached as a parent
  keeps its node but gives no cell (``future_cells_dropped``); and a peer task row's label
  describes the window after *its* seed time, so a label whose window ends after the anchor
  gives no cell (``label_cells_withheld``);
- numbers and times are normalised with statistics over rows at or before the last training
  seed time (rows without a time: all), std 0 -> 1.

Text goes through the library's ``CachedEncoder`` around the harness's ``hashing_encoder``: a
per-process cache, so a string seen in an earlier chunk is a hit (``TextCache``).

The per-target call into the library is the one Python loop here (the library assembles one
context per call, in Python); everything before and after it is over whole columns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from relational_transformers.constants import MAX_F2P, SEM_BOOLEAN, SEM_DATETIME, SEM_NUMBER, SEM_TEXT
from relational_transformers_utils import (
    CachedEncoder,
    ColumnarStore,
    ColumnarTraversal,
    ColumnDef,
    ContextPolicy,
    ContextTruncated,
    LinkDef,
    Schema,
    TableDef,
    TemporalBound,
    ValueType,
)

from tasks.libraries.relational_transformers.checks import LIBRARY, spec_graph_refusals
from tasks.libraries.relational_transformers.contexts import (
    D_TEXT,
    Contexts,
    Stats,
    _labels,
    _mean_std,
    _numbers,
    _seconds,
    _strings,
    _table_column,
    _target_sem,
    _train_mask,
    hashing_encoder,
)
from tasks.measure.clock import wall_clock
from tasks.runtime.errors import UserError
from tasks.spec import Spec

__all__ = [
    "BUDGET_KEYS",
    "AssemblyFigures",
    "GraphStore",
    "GraphTables",
    "TextCache",
    "graph_tables",
    "policy_of",
    "spec_graph_tables",
]

Floats = npt.NDArray[np.float64]
Int64s = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

KEY = "model.rt.context"
BUDGET_KEYS = ("max_context_cells", "local_context_cells", "bfs_width", "num_walks", "walk_length", "prefer_latest")

_VALUE_TYPE = {
    "numeric": ValueType.NUMBER,
    "timestamp": ValueType.DATETIME,
    "category": ValueType.TEXT,
    "text": ValueType.TEXT,
}


def policy_of(spec: Spec) -> ContextPolicy:
    """The library's ``ContextPolicy`` from ``model.rt.context`` (seed: its own, else run.seed)."""
    c = spec.model.rt.context
    return ContextPolicy(
        max_context_cells=c.max_context_cells,
        local_context_cells=c.local_context_cells,
        bfs_width=c.bfs_width,
        num_walks=c.num_walks,
        walk_length=c.walk_length,
        prefer_latest=c.prefer_latest,
        seed=c.seed if c.seed is not None else spec.run.seed,
    )


# --- the tables --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableSpec:
    """One database table of the graph: its key, time, declared inputs and foreign keys."""

    pkey: str | None
    time: str | None
    columns: dict[str, str]  # input column -> kind (numeric | timestamp | category | text)
    fkeys: dict[str, str]  # foreign-key column -> table (within the graph)


@dataclass(frozen=True)
class GraphTables:
    """Everything the store is built from: the database tables (Arrow) and the task's rows."""

    entity: str  # the entity table (the task's entity_table)
    task: str  # the task table's name (the spec's root table)
    entity_col: str
    seed_time: str
    target: str
    key: str  # the root key (seed_key)
    window_seconds: float  # the task's timedelta: a label is known this long after its seed time
    train_bound: float  # the last training seed time, epoch seconds (statistics go up to it)
    specs: dict[str, TableSpec]
    tables: dict[str, pa.Table]
    task_rows: pa.Table  # key, entity, seed time, target (+ task_columns): every split's rows, sorted by key
    # the spec's schema: the root's input columns, carried by the task rows (RelBench: the entity table's)
    task_columns: dict[str, str] = field(default_factory=dict)
    # False: the root has no seed time; ``seed_time`` is then one constant (NO_ANCHOR) the library
    # needs to find a task row, never a cell and never a cut
    anchored: bool = True
    task_train: Bools | None = None  # the spec's schema: the task rows' split (statistics of root columns)


def graph_tables(spec: Spec, folder: Any, read: Callable[[str, list[str]], pa.Table]) -> GraphTables:
    """The graph of ``spec``'s RelBench folder: the entity table and every branch table with the
    columns the spec declares for it (plus its time column), foreign keys from the folder's
    manifest between them, and the task's rows. ``read(table, columns) -> pa.Table`` reads a
    whole table (the harness's sources); ``folder`` is the opened ``tasks.spec.relbench.Folder``."""
    if spec.source.relbench is None:
        raise _no_folder()
    tables, tm = folder.manifest.tables, folder.task_manifest
    root = spec.schema_.root
    declared: dict[str, dict[str, str]] = {folder.entity_table: dict(root.columns)}
    for b, _ in spec.schema_.walk():
        declared.setdefault(b.table, {}).update(b.columns)
    specs: dict[str, TableSpec] = {}
    for name, columns in declared.items():
        meta = tables[name]
        cols = dict(columns)
        time = str(meta.time_col) if meta.time_col else None
        if time is not None and time not in cols:
            cols[time] = "timestamp"  # the library emits a row's time as a cell: declared
        fkeys = {str(c): str(t) for c, t in (meta.fkeys or {}).items() if t in declared}
        specs[name] = TableSpec(str(meta.pkey) if meta.pkey else None, time, cols, fkeys)
    arrow = {}
    for name, s in specs.items():
        wanted = list(dict.fromkeys([*([s.pkey] if s.pkey else []), *s.fkeys, *s.columns]))
        arrow[name] = read(name, wanted)
    from tasks.spec.relbench import SPLIT

    ent, seed_time, target = str(tm.entity_col), str(root.seed_time), spec.task.target
    rows = read(root.table, [root.key, ent, seed_time, target, SPLIT])
    rows = rows.sort_by(root.key)
    train = pc.equal(rows[SPLIT], "train")
    times = _seconds(_table_column(rows, seed_time), f"{root.table}.{seed_time}")[0]
    train_np = np.asarray(train.to_numpy(zero_copy_only=False), dtype=bool)
    bound = float(times[train_np].max()) if train_np.any() else float("inf")
    return GraphTables(
        entity=folder.entity_table,
        task=root.table,
        entity_col=ent,
        seed_time=seed_time,
        target=target,
        key=root.key,
        window_seconds=float(pd.Timedelta(str(tm.timedelta)).total_seconds()) if tm.timedelta else 0.0,
        train_bound=bound,
        specs=specs,
        tables=arrow,
        task_rows=rows.select([root.key, ent, seed_time, target]),
    )


def _no_folder() -> RuntimeError:
    return RuntimeError("a spec without source.relbench has no RelBench folder: its graph is spec_graph_tables'")


# The task rows' one time when the root has no seed time: the library finds a target by (entity,
# anchor) and a missing time never matches (NaN keys), so every row stands at the epoch; no table
# has a time column then (branches[].time needs schema.root.seed_time), so the cut-off admits all.
NO_ANCHOR = "__anchor"


def spec_graph_tables(
    spec: Spec,
    read: Callable[[str, list[str]], pa.Table],
    train_of: Callable[[pa.Table], Bools],
) -> GraphTables:
    """The graph of the spec's own schema: an entity table (the distinct values of
    ``schema.root.entity``, else of the root key: keys only, no cell), the root's rows as the
    library's task table (entity, seed time, the root's columns, the target), and every branch's
    table with its declared columns (and its ``time``), linked by ``parent_key`` to its parent's
    table, at any depth. ``read(table, columns)`` reads a whole table through the run's sources;
    ``train_of(root rows)`` is the harness's split: only training rows' labels are given to the
    library (held-out labels never enter any context, as another row's peer label either)."""
    problems = spec_graph_refusals(spec)
    if problems:
        raise UserError(" ".join(p.message(LIBRARY) for p in problems))
    root, target = spec.schema_.root, spec.task.target
    entity_col = root.entity or root.key
    anchored = root.seed_time is not None
    entity = f"{root.table}.{entity_col}"  # the entity table's name: never a branch's table
    table_of: dict[str | None, str] = {None: entity}
    specs: dict[str, TableSpec] = {entity: TableSpec(entity_col, None, {}, {})}
    for b, parent in spec.schema_.walk():
        table_of[b.name] = b.table
        time = b.time if anchored else None
        old = specs.get(b.table, TableSpec(None, None, {}, {}))
        columns = {**old.columns, **b.columns}
        if time is not None and time not in columns:
            columns[time] = "timestamp"  # the library emits a row's time as a cell: declared
        specs[b.table] = TableSpec(
            b.key or old.pkey, time or old.time, columns, {**old.fkeys, b.parent_key: table_of[parent]}
        )
    arrow: dict[str, pa.Table] = {}
    for name, s in specs.items():
        if name == entity:
            continue
        wanted = list(dict.fromkeys([*([s.pkey] if s.pkey else []), *s.fkeys, *s.columns]))
        t = _plain(read(name, wanted))
        if s.time is not None:  # the as-of rule (tasks/stages/asof.py): a row without a time never enters
            t = t.filter(pc.is_valid(t[s.time]))
        arrow[name] = _sorted(t)

    inputs: dict[str, str] = {c: k for c, k in root.columns.items() if c != target}
    wanted = [root.key, entity_col, *([root.seed_time] if root.seed_time else []), target]
    wanted += [*([root.split] if root.split else []), *inputs]
    rows = _plain(read(root.table, list(dict.fromkeys(wanted))))
    _check_root_rows(rows, spec, entity_col)
    train = np.asarray(train_of(rows), dtype=bool)
    seed_time = root.seed_time or NO_ANCHOR
    if root.seed_time is None:
        rows = rows.append_column(NO_ANCHOR, pa.array(np.zeros(rows.num_rows, "datetime64[us]"), pa.timestamp("us")))
    labels = _table_column(rows, target)
    held_out = pa.array(~train)
    rows = rows.set_column(
        rows.schema.get_field_index(target), target, pc.if_else(held_out, pa.nulls(len(labels), labels.type), labels)
    )
    rows = rows.append_column("__train_row", pa.array(train))
    rows = rows.sort_by(root.key)
    train = np.asarray(rows["__train_row"].to_numpy(), dtype=bool)
    entities = pc.unique(_table_column(rows, entity_col))
    entities = entities.take(pc.sort_indices(entities))
    arrow[entity] = pa.table({entity_col: entities})
    times = _seconds(_table_column(rows, seed_time), f"{root.table}.{seed_time}")[0]
    bound = float(times[train].max()) if anchored and train.any() else float("inf")
    return GraphTables(
        entity=entity,
        task=root.table,
        entity_col=entity_col,
        seed_time=seed_time,
        target=target,
        key=root.key,
        window_seconds=0.0,
        train_bound=bound,
        specs={entity: specs[entity], **{k: v for k, v in specs.items() if k != entity}},
        tables=arrow,
        task_rows=rows.select(list(dict.fromkeys([root.key, entity_col, seed_time, target, *inputs]))),
        task_columns=inputs,
        anchored=anchored,
        task_train=train,
    )


def _plain(table: pa.Table) -> pa.Table:
    """Dictionary columns as their values (what a file and a database table both give)."""
    for i, f in enumerate(table.schema):
        if pa.types.is_dictionary(f.type):
            table = table.set_column(i, f.name, table.column(i).cast(f.type.value_type))
    return table


def _sorted(table: pa.Table) -> pa.Table:
    """Rows in the order of all their values: the store numbers nodes by row position and the
    library seeds its draws with node ids, so the same rows give the same contexts whatever order
    the source returned them in (files, or a database's scan)."""
    return table.sort_by([(c, "ascending") for c in table.column_names]) if table.num_rows else table


def _check_root_rows(rows: pa.Table, spec: Spec, entity_col: str) -> None:
    """Every root row must be one task row the library can find: an entity, a seed time when the
    schema has one, and no two rows at the same (entity, seed time)."""
    root = spec.schema_.root
    where = "schema.root.entity" if root.entity else "schema.root.key"
    nulls = _table_column(rows, entity_col).null_count
    if nulls:
        raise UserError(
            f"{KEY}.builder rt_utils: {nulls} row(s) of table '{root.table}' have no {entity_col} ({where}), so no "
            f"entity to link them to; drop or fill them, or set {KEY}.builder: nested"
        )
    cols = [entity_col]
    if root.seed_time is not None:
        cols.append(root.seed_time)
        nulls = _table_column(rows, root.seed_time).null_count
        if nulls:
            raise UserError(
                f"{KEY}.builder rt_utils: {nulls} row(s) of table '{root.table}' have no seed time "
                f"(schema.root.seed_time '{root.seed_time}'), and the library anchors each context at its row's "
                f"time; drop or fill them, or set {KEY}.builder: nested"
            )
    groups = rows.select(cols).group_by(cols).aggregate([([], "count_all")])
    repeated = pc.sum(pc.greater(groups["count_all"], 1)).as_py() or 0
    if repeated:
        what = f"({entity_col}, {root.seed_time})" if root.seed_time else entity_col
        fix = (
            "make each (entity, seed time) one row"
            if root.seed_time
            else "set schema.root.seed_time to the column that tells those rows apart"
        )
        raise UserError(
            f"{KEY}.builder rt_utils: {repeated} value(s) of {what} repeat in table '{root.table}'; the library "
            f"finds a context's target row by its entity and seed time, so each must name one row: {fix}, or set "
            f"{KEY}.builder: nested"
        )


def _numpy(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A column as the store reads it: numbers (float, NaN for null), datetime64 (NaT), objects."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.cast(t.value_type)
        t = arr.type
    if pa.types.is_decimal(t) or pa.types.is_boolean(t) or pa.types.is_integer(t) and arr.null_count:
        arr = arr.cast(pa.float64())
    return np.asarray(arr.to_numpy(zero_copy_only=False))


# --- the store ---------------------------------------------------------------------------------


@dataclass
class AssemblyFigures:
    """Seconds and counts of the builder over a run (every call, timed stages or not)."""

    store_seconds: float = 0.0  # the store and its graph, once
    assembly_seconds: float = 0.0  # the library's traverse, every context
    cells_seconds: float = 0.0  # node ids -> cells
    contexts: int = 0
    budget_full: int = 0  # contexts whose emitted rows reached max_context_cells
    future_cells_dropped: int = 0
    label_cells_withheld: int = 0
    cells: list[Int64s] = field(default_factory=list)  # cells per context, predict-phase chunks


class _Task:
    """The library's ``TaskAdapter`` for a stored task table (the store reads only its names)."""

    def __init__(self, table: str, target: str, time: str) -> None:
        self.id, self.table_name, self.target_column, self.time_column = table, table, target, time
        self.direct_target = True

    def spec(self, query: Any, schema: Schema) -> _Task:
        return self

    def window_span(self, query: Any) -> Any | None:
        return None

    def aggregated_tables(self, query: Any, entity_table: str) -> set[str]:
        return set()

    def label(self, query: Any, schema: Schema, visible: dict[Any, Any], entity_cells: dict[Any, Any], ts: Any) -> None:
        return None


def _no_task_row(message: str) -> None:
    raise RuntimeError(f"relational-transformers-utils: {message}")


class GraphStore:
    """The library's store and traversal over ``GraphTables``; ``contexts`` per chunk."""

    def __init__(self, spec: Spec, g: GraphTables, figures: AssemblyFigures | None = None) -> None:
        self.spec, self.g = spec, g
        self.figures = figures or AssemblyFigures()
        self.policy = policy_of(spec)
        t0 = wall_clock()
        defs = [
            TableDef(
                name,
                tuple(ColumnDef(c, _VALUE_TYPE[k]) for c, k in s.columns.items()),
                s.pkey,
                s.time,
            )
            for name, s in g.specs.items()
        ]
        links = [LinkDef(name, fk, to) for name, s in g.specs.items() for fk, to in s.fkeys.items()]
        self.schema = Schema(tuple(defs), tuple(links))
        frames = {name: {c: _numpy(t.column(c)) for c in t.column_names} for name, t in g.tables.items()}
        task_cols = dict.fromkeys((g.entity_col, g.seed_time, *g.task_columns, g.target))
        task_frame = {c: _numpy(g.task_rows.column(c)) for c in task_cols}
        self.store = ColumnarStore(
            self.schema,
            frames,
            task_frames={g.task: task_frame},
            task_links={g.task: (g.entity, g.entity_col, g.seed_time)},
        )
        if not g.anchored:  # the constant anchor is no cell: out of the budget's count too
            base = self.store.base[g.task]
            self.store.node_cells[base : base + g.task_rows.num_rows] -= 1
        self.store.native_graph()
        self.f2p_off, self.f2p = self.store.f2p_offsets, self.store.f2p_parent
        if len(self.f2p_off) > 1 and int(np.diff(self.f2p_off).max()) > MAX_F2P:
            raise UserError(
                f"{KEY}.builder rt_utils: a row has more than {MAX_F2P} foreign-key parents in the graph; "
                f"RT-J reads at most {MAX_F2P} per cell (f2p_nbr_idxs). Leave columns out of the schema"
            )
        self.adapter = _Task(g.task, g.target, g.seed_time)
        self.traversal = ColumnarTraversal(self.store, task_adapter=self.adapter, fallback=_no_task_row)
        # column ids: every (table, column) in the store's order; table ids: that order
        self.order = list(self.store.order)
        self.columns: list[tuple[str, str, str]] = []  # (table, column, kind)
        for name in self.order:
            if name == g.task:
                self.columns += [(name, g.seed_time, "timestamp")] if g.anchored else []
                self.columns += [(name, c, k) for c, k in g.task_columns.items() if c != g.seed_time]
                self.columns += [(name, g.target, "target")]
            else:
                self.columns += [(name, c, k) for c, k in g.specs[name].columns.items()]
        self.column_names = pa.array([f"{c} of {t}" for t, c, _ in self.columns], pa.large_string())
        task = g.task_rows
        self.task_ts = _seconds(_table_column(task, g.seed_time), f"{g.task}.{g.seed_time}")[0]
        self.task_entities = _table_column(task, g.entity_col)
        self.figures.store_seconds += wall_clock() - t0

    def fit_scales(self) -> dict[str, tuple[float, float]]:
        """Means and stds of every numeric and time column over rows at or before the last
        training seed time (rows without a time: all of them)."""
        g, out = self.g, {}
        for t, c, kind in self.columns:
            if kind not in ("numeric", "timestamp"):
                continue
            table = g.task_rows if t == g.task else g.tables[t]
            values, valid = self._scalars(table, c, kind, t)
            base = self.store.base[t]
            ts = self.store.node_ts[base : base + table.num_rows]
            known = np.isnan(ts) | (ts <= g.train_bound)
            if t == g.task and g.task_train is not None:  # the root's columns: its training rows
                known = g.task_train
            out[f"{t}.{c}"] = _mean_std(values[valid & known])
        return out

    @staticmethod
    def _scalars(table: pa.Table, column: str, kind: str, name: str) -> tuple[Floats, Bools]:
        where = f"column '{column}' of '{name}'"
        arr = _table_column(table, column)
        return _seconds(arr, where) if kind == "timestamp" else _numbers(arr, where)

    # --- contexts ------------------------------------------------------------------------------

    def targets(self, keys: pa.Array) -> Int64s:
        """Task-table positions of root keys (every key is a task row)."""
        idx = pc.index_in(keys, value_set=_table_column(self.g.task_rows, self.g.key))
        if idx.null_count:
            raise RuntimeError("a root key is not a row of the task's table")
        return np.asarray(idx.to_numpy(zero_copy_only=False), dtype=np.int64)

    def assemble(self, positions: Int64s) -> list[Int64s]:
        """Emitted node ids per target, from the library's traverse (one call per target)."""
        t0 = wall_clock()
        g, out = self.g, []
        entities = self.task_entities.take(pa.array(positions)).to_pylist()
        anchors = pd.to_datetime(self.task_ts[positions], unit="s", utc=True).to_pydatetime()
        full = 0
        for entity, anchor in zip(entities, anchors, strict=True):
            try:
                res = self.traversal.traverse(
                    self.schema,
                    None,
                    g.entity,
                    entity,
                    TemporalBound.at_or_before(anchor),
                    self.policy,
                    query=self.adapter,
                )
            except ContextTruncated as err:
                raise UserError(_truncated(err)) from None
            out.append(np.fromiter((n for _, n in res.node_ids), dtype=np.int64, count=len(res.node_ids)))
            full += int(res.hit_cell_budget)
        self.figures.assembly_seconds += wall_clock() - t0
        self.figures.contexts += len(positions)
        self.figures.budget_full += full
        return out

    def contexts(self, table: pa.Table, stats: Stats, *, predict: bool = False) -> Contexts:
        """One context per row of the chunk ``table`` (the harness's preprocessed rows: key,
        target, ``__train``), built by the library and turned into cells here."""
        positions = self.targets(_table_column(table, self.g.key))
        emitted = self.assemble(positions)
        t0 = wall_clock()
        out = self._cells(table, stats, positions, emitted)
        self.figures.cells_seconds += wall_clock() - t0
        if predict:
            self.figures.cells.append(out.lengths)
        return out

    def _cells(self, table: pa.Table, stats: Stats, positions: Int64s, emitted: list[Int64s]) -> Contexts:
        g, store, spec = self.g, self.store, self.spec
        n = len(positions)
        counts = np.array([len(e) for e in emitted], dtype=np.int64)
        node = np.concatenate(emitted) if emitted else np.zeros(0, np.int64)
        ctx = np.repeat(np.arange(n, dtype=np.int64), counts)
        anchor = self.task_ts[positions][ctx]
        node_ts = store.node_ts[node]
        future = ~np.isnan(node_ts) & (node_ts > anchor)
        self.figures.future_cells_dropped += int(store.node_cells[node[future]].sum())
        target_node = store.base[g.task] + positions  # per context
        tab = store.node_table_idx[node]
        parents = self._parents(node)

        parts: list[dict[str, Any]] = []
        strings: list[pa.Array] = []
        n_strings = 0
        for col_id, (t, c, kind) in enumerate(self.columns):
            t_idx = self.order.index(t)
            sel = np.flatnonzero((tab == t_idx) & ~future)
            if sel.size == 0:
                continue
            pos = node[sel] - store.base[t]
            source = g.task_rows if t == g.task else g.tables[t]
            arr = _table_column(source, c).take(pa.array(pos))
            if kind == "target":
                focal = node[sel] == target_node[ctx[sel]]
                # the target's own cell: a masked query, whatever its label
                parts.append(self._part(sel[focal], col_id, t_idx, _target_sem(spec.task.kind), target=True))
                peer = sel[~focal]
                arr = arr.filter(pa.array(~focal))
                known = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
                matured = node_ts[peer] + g.window_seconds <= anchor[peer]
                self.figures.label_cells_withheld += int((known & ~matured).sum())
                keep = known & matured
                peer, arr = peer[keep], arr.filter(pa.array(keep))
                part, text = self._label_part(peer, arr, col_id, t_idx, stats, n_strings)
            else:
                part, text = self._value_part(sel, arr, kind, col_id, t_idx, f"{t}.{c}", stats, n_strings)
            if part is None:
                continue
            parts.append(part)
            if text is not None:
                strings.append(text)
                n_strings += len(text)
        return self._assemble(table, stats, n, ctx, node, parents, parts, strings)

    def _parents(self, node: Int64s) -> Int64s:
        off, par = self.f2p_off, self.f2p
        start = off[node]
        count = off[node + 1] - start
        out = np.full((len(node), MAX_F2P), -1, dtype=np.int64)
        if par.size:
            for k in range(MAX_F2P):  # five columns, each over every cell at once
                has = count > k
                out[has, k] = par[start[has] + k]
        return out

    @staticmethod
    def _part(cells: Int64s, col: int, tab: int, sem: int, *, target: bool = False) -> dict[str, Any]:
        return {"cells": cells, "column": col, "table": tab, "sem": sem, "target": target}

    def _value_part(
        self, sel: Int64s, arr: pa.Array, kind: str, col: int, tab: int, name: str, stats: Stats, n_strings: int
    ) -> tuple[dict[str, Any] | None, pa.Array | None]:
        if kind in ("numeric", "timestamp"):
            values, valid = _seconds(arr, name) if kind == "timestamp" else _numbers(arr, name)
            mean, std = stats.scales.get(name, (0.0, 1.0))
            keep = np.flatnonzero(valid)
            part = self._part(sel[keep], col, tab, SEM_DATETIME if kind == "timestamp" else SEM_NUMBER)
            part["datetime" if kind == "timestamp" else "number"] = ((values[keep] - mean) / std).astype(np.float32)
            return part, None
        text = _strings(arr)
        keep = np.flatnonzero(np.asarray(text.is_valid().to_numpy(zero_copy_only=False), dtype=bool))
        kept = text.take(pa.array(keep))
        part = self._part(sel[keep], col, tab, SEM_TEXT)
        part["text"] = np.arange(n_strings, n_strings + len(kept), dtype=np.int64)
        return part, kept

    def _label_part(
        self, peer: Int64s, arr: pa.Array, col: int, tab: int, stats: Stats, n_strings: int
    ) -> tuple[dict[str, Any] | None, pa.Array | None]:
        """Earlier task rows' labels, as the target's column: a boolean, a number, a class."""
        if peer.size == 0:
            return None, None
        kind = self.spec.task.kind
        if kind == "binary":
            flags = arr if pa.types.is_boolean(arr.type) else arr.cast(pa.bool_())
            part = self._part(peer, col, tab, SEM_BOOLEAN)
            part["boolean"] = np.asarray(flags.cast(pa.float32()).to_numpy(zero_copy_only=False), dtype=np.float32)
            return part, None
        if kind == "regression":
            values, _ = _numbers(arr, f"task.target '{self.g.target}'")
            part = self._part(peer, col, tab, SEM_NUMBER)
            part["number"] = ((values - stats.target_mean) / stats.target_std).astype(np.float32)
            return part, None
        text = _strings(arr)
        part = self._part(peer, col, tab, SEM_TEXT)
        part["text"] = np.arange(n_strings, n_strings + len(text), dtype=np.int64)
        return part, text

    def _assemble(
        self,
        table: pa.Table,
        stats: Stats,
        n: int,
        ctx: Int64s,
        node: Int64s,
        parents: Int64s,
        parts: list[dict[str, Any]],
        strings: list[pa.Array],
    ) -> Contexts:
        if strings:
            encoded = pc.dictionary_encode(pa.concat_arrays(strings))
            distinct = encoded.dictionary
            string_index = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        else:
            distinct, string_index = pa.array([], pa.large_string()), np.zeros(0, np.int64)
        cells = np.concatenate([p["cells"] for p in parts]) if parts else np.zeros(0, np.int64)

        def gather(name: str, fill: Any, dtype: Any) -> Any:
            chunks = [
                np.asarray(p[name], dtype=dtype) if name in p else np.full(len(p["cells"]), fill, dtype=dtype)
                for p in parts
            ]
            return np.concatenate(chunks) if chunks else np.zeros(0, dtype=dtype)

        def each(name: str, dtype: Any) -> Any:
            chunks = [np.full(len(p["cells"]), p[name], dtype=dtype) for p in parts]
            return np.concatenate(chunks) if chunks else np.zeros(0, dtype=dtype)

        # context-major; within a context, the library's emission order, then column order
        order = np.lexsort((each("column", np.int64), cells, ctx[cells]))
        text_pos = gather("text", -1, np.int64)
        text = np.where(text_pos >= 0, string_index[np.maximum(text_pos, 0)] if string_index.size else -1, -1)
        per_context = np.bincount(ctx[cells], minlength=n)
        return Contexts(
            keys=_table_column(table, self.g.key),
            offsets=np.concatenate([[0], np.cumsum(per_context)]).astype(np.int64),
            node=node[cells][order],
            parents=parents[cells][order],
            column=each("column", np.int64)[order],
            table=each("table", np.int64)[order],
            sem=each("sem", np.int8)[order],
            is_target=each("target", np.bool_)[order],
            number=gather("number", 0.0, np.float32)[order],
            datetime=gather("datetime", 0.0, np.float32)[order],
            text=text[order].astype(np.int64),
            strings=distinct,
            column_names=self.column_names,
            labels=_labels(table, self.spec, stats),
            train=_train_mask(table),
            nodes_per_table={t: int(self.store._table(t).n) for t in self.order},
            boolean=gather("boolean", 0.0, np.float32)[order],
        )


def _truncated(err: Exception) -> str:
    return (
        f"relational-transformers-utils raised ContextTruncated: {err} The library sizes that buffer as the "
        f"store's node count, so it binds when one context would emit (nearly) every row of the graph: "
        f"lower {KEY}.max_context_cells (or {KEY}.local_context_cells) below the graph's cells, or give the "
        "graph more rows; no context is cut silently"
    )


# --- text -------------------------------------------------------------------------------------


@dataclass
class TextCache:
    """The library's ``CachedEncoder`` in front of ``hashing_encoder``, counting hits and misses
    (strings asked for, each distinct per call, that were / were not already cached)."""

    hits: int = 0
    misses: int = 0
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self.cache = CachedEncoder(self._encode_missing)

    def _encode_missing(self, texts: list[str], normalize: bool = False) -> npt.NDArray[np.float32]:
        self.misses += len(texts)
        return hashing_encoder(pa.array(texts, pa.large_string()))

    def __call__(self, strings: pa.Array) -> npt.NDArray[np.float32]:
        t0 = wall_clock()
        texts = [str(s) for s in _strings(strings).to_pylist()]
        before = self.misses
        vectors = self.cache.encode(texts)
        self.hits += len(dict.fromkeys(texts)) - (self.misses - before)
        out = np.stack(vectors).astype(np.float32) if vectors else np.zeros((0, D_TEXT), np.float32)
        self.seconds += wall_clock() - t0
        return out


def stats_for(base: Stats, graph: GraphStore) -> Stats:
    """``base`` (the target's classes or scale, from fit_stats) with the graph's column scales."""
    return dataclasses.replace(base, scales=graph.fit_scales())


def relbench_folder(spec: Spec, sources: Mapping[str, Any]) -> Any:
    """The RelBench folder the spec's tables come from (its db/ files), manifests read."""
    from tasks.sources.files import SourceTable
    from tasks.spec.relbench import open_folder

    rb = spec.source.relbench
    if rb is None:
        raise _no_folder()
    for name, src in sources.items():
        if name != spec.schema_.root.table and isinstance(src, SourceTable) and src.files:
            path = Path(src.files[0]).parent.parent
            if (path / "manifest.yaml").is_file():
                return open_folder(path, rb.task)
    raise UserError(
        f"{KEY}.builder rt_utils reads the RelBench folder's db/ files, and this run reads its tables from "
        "source.database; remove source.database or set the builder to nested"
    )
