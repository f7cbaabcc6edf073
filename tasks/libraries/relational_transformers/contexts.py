"""Relational contexts for relational-transformers 0.1.0: the application's part, columnar.

RT-J never sees strings or tables: the application turns rows into cells (one cell per
present value of a row), gives every row a node id and every cell its row's foreign-key
parent node ids, normalises numbers and times, and encodes strings and column names as
384-wide vectors. This module does that over the harness's preprocessed nested table (one
Arrow row per root key, one ``list<struct>`` column per branch, nested to any depth) with
Arrow and NumPy over whole columns: no Python loop over rows or contexts.

Mapping (the README holds the reasoning):

- One context per root row. Its cells: exactly one target cell (the root's ``task.target``,
  a masked query: its value never enters the input, so a null or absent label still gets a
  target cell and a prediction), the root row's non-null input cells, and every kept row of
  every branch under it (preprocess already applied ``max_length``, ``overflow``,
  ``order_by``), each with its non-null input cells.
- Node ids: the root row ``r`` of the chunk is node ``r``; row ``i`` of a branch's flattened
  rows is node ``offset + i``, the offset being the rows of every node before it. Ids are
  unique across tables and contexts by construction: no natural key ever becomes a node id,
  so tables whose keys overlap cannot collide.
- Parent links (``f2p_nbr_idxs``): ``links="parent"`` (default, RT-J's own semantics): a
  branch row's cells carry the node id of the row its ``parent_key`` points at, so every row
  has exactly one parent. ``links="ancestors"``: every ancestor up to the root, so a row at
  depth ``d`` has ``d`` parents; RT-J allows 5 (``MAX_F2P``), so a branch deeper than 5 is a
  ``UserError`` naming it (``check`` refuses it from the spec, before any work).
- ``table_name_idxs`` is the node's index (root, then branches in schema order) and
  ``col_name_idxs`` one id per (node, column): the library's "col" attention joins cells of
  the same column and table, and two branches over one physical table stay apart.
- Numeric and timestamp cells: ``(x - mean) / std`` with the training split's statistics
  (``fit_stats`` over ``__train`` rows; std 0 becomes 1). Timestamps and dates are seconds
  since the epoch first. NaN and infinite numbers are missing values.
- Missing values (null, NaN) are no cell at all: RT-J has no null vector, and the library
  refuses non-finite scalars.
- Category and text cells: semantic type text, the value's string vector; column names:
  ``"<column> of <table>"`` (the RT paper's wording) as a string vector. Both come from the
  separate ``encode`` step over each distinct string once.

``collate`` builds the library's ``RelationalBatch`` for a set of contexts with the
library's padding conventions (``model._collate_batches``: pad to the longest context,
``f2p`` -1, ``is_padding`` True, everything else 0), vectorised instead of one small batch
per context.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import torch
from relational_transformers import RelationalBatch
from relational_transformers.constants import MAX_F2P, SEM_BOOLEAN, SEM_DATETIME, SEM_NUMBER, SEM_TEXT

from tasks.runtime.errors import UserError
from tasks.spec import Spec

__all__ = [
    "D_TEXT",
    "MAX_PARENTS",
    "TRAIN_COLUMN",
    "ContextConfig",
    "Contexts",
    "Encoded",
    "Encoder",
    "LinkMode",
    "Stats",
    "build_contexts",
    "cells_padded",
    "cells_present",
    "collate",
    "encode",
    "fit_stats",
    "hashing_encoder",
    "plan_batches",
]

D_TEXT = 384
"""RT-J's cell-vector width: the published models read all-MiniLM-L12-v2 sentence vectors."""
MAX_PARENTS = MAX_F2P
TRAIN_COLUMN = "__train"
"""tasks/stages/split.py's column name; not imported, so this package stays off tasks.stages
(the tests run the real preprocess and would catch a rename)."""

LinkMode = Literal["parent", "ancestors"]
Int64s = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

Encoder = Callable[[pa.Array], npt.NDArray[np.float32]]
"""Distinct strings (an Arrow string array without nulls) -> float32 ``[n, 384]``."""

ROOT = "root"


@dataclass(frozen=True)
class ContextConfig:
    links: LinkMode = "parent"


# --- the schema as nodes -------------------------------------------------------------------


@dataclass(frozen=True)
class _Node:
    name: str
    table: str
    parent: int  # index into the node list; -1 for the root
    depth: int  # foreign-key hops from the root (the target's row)
    columns: tuple[tuple[str, str], ...]  # (column, kind), the target excluded


def _nodes(spec: Spec) -> list[_Node]:
    root = spec.schema_.root
    target = spec.task.target
    nodes = [_Node(ROOT, root.table, -1, 0, tuple((c, k) for c, k in root.columns.items() if c != target))]
    index = {ROOT: 0}
    for branch, parent in spec.schema_.walk():
        p = index[parent or ROOT]
        index[branch.name] = len(nodes)
        nodes.append(_Node(branch.name, branch.table, p, nodes[p].depth + 1, tuple(branch.columns.items())))
    return nodes


def _column_names(nodes: list[_Node], spec: Spec) -> list[str]:
    """Column-name strings by column id: every (node, input column), then the target."""
    names = [f"{c} of {n.table}" for n in nodes for c, _ in n.columns]
    return [*names, f"{spec.task.target} of {nodes[0].table}"]


# --- flattening the nested table --------------------------------------------------------------


@dataclass
class _Rows:
    """One node's rows in the chunk, flattened across every parent."""

    columns: Callable[[str], pa.Array]
    list_of: Callable[[str], pa.Array]  # a child branch's list column, aligned with these rows
    context: Int64s  # root row of each row
    parent: Int64s  # row index in the parent node's rows (-1 for the root)

    @property
    def count(self) -> int:
        return len(self.context)


def _table_column(table: pa.Table, name: str) -> pa.Array:
    col = table.column(name)
    return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)


def _flatten(table: pa.Table, nodes: list[_Node]) -> list[_Rows]:
    n = table.num_rows
    out = [
        _Rows(
            columns=lambda c: _table_column(table, c),
            list_of=lambda c: _table_column(table, c),
            context=np.arange(n, dtype=np.int64),
            parent=np.full(n, -1, dtype=np.int64),
        )
    ]
    for node in nodes[1:]:
        up = out[node.parent]
        lists = up.list_of(node.name)
        flat = cast(pa.StructArray, pc.list_flatten(lists))
        parent = np.asarray(pc.list_parent_indices(lists).to_numpy(zero_copy_only=False), dtype=np.int64)
        field_of = _struct_getter(flat)
        out.append(_Rows(field_of, field_of, up.context[parent], parent))
    return out


def _struct_getter(flat: pa.StructArray) -> Callable[[str], pa.Array]:
    def get(name: str) -> pa.Array:
        return pc.struct_field(flat, name)

    return get


# --- values -----------------------------------------------------------------------------------


def _seconds(arr: pa.Array, where: str) -> tuple[Floats, Bools]:
    t = arr.type
    if pa.types.is_timestamp(t):
        per_second = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}[t.unit]
        raw = arr.cast(pa.int64())
        values = raw.to_numpy(zero_copy_only=False).astype(np.float64) / per_second
    elif pa.types.is_date32(t):
        values = arr.cast(pa.int32()).to_numpy(zero_copy_only=False).astype(np.float64) * 86400.0
    elif pa.types.is_date64(t):
        values = arr.cast(pa.int64()).to_numpy(zero_copy_only=False).astype(np.float64) / 1e3
    else:
        raise UserError(
            f"{where} is declared timestamp but holds {t}; declare it with the kind that fits "
            "(numeric, category, text) or cast it to a date or timestamp"
        )
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return np.where(valid, values, 0.0), valid


def _numbers(arr: pa.Array, where: str) -> tuple[Floats, Bools]:
    t = arr.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) or pa.types.is_boolean(t)):
        raise UserError(
            f"{where} is declared numeric but holds {t}; declare it category or text, or cast it to a number"
        )
    # integers past 2**53 round to the nearest float (a checked cast refuses the column)
    values = arr.cast(pa.float64(), safe=not pa.types.is_integer(t)).fill_null(np.nan).to_numpy(zero_copy_only=False)
    values = np.asarray(values, dtype=np.float64)
    # NaN and infinities are missing values: the library refuses non-finite scalar channels
    valid = np.isfinite(values)
    return np.where(valid, values, 0.0), valid


def _strings(arr: pa.Array) -> pa.Array:
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    return arr if pa.types.is_large_string(arr.type) else arr.cast(pa.large_string())


def _scalars(arr: pa.Array, kind: str, where: str) -> tuple[Floats, Bools]:
    return _seconds(arr, where) if kind == "timestamp" else _numbers(arr, where)


# --- training statistics --------------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    """Training-split statistics: what every chunk is normalised with (saved beside weights)."""

    scales: dict[str, tuple[float, float]]  # "node.column" -> (mean, std) of numeric/timestamp
    classes: tuple[str, ...] = ()  # category target: training classes, sorted
    target_mean: float = 0.0  # regression target
    target_std: float = 1.0
    train_rows: int = 0

    def to_json(self) -> str:
        return json.dumps(
            {
                "scales": {k: list(v) for k, v in self.scales.items()},
                "classes": list(self.classes),
                "target_mean": self.target_mean,
                "target_std": self.target_std,
                "train_rows": self.train_rows,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Stats:
        d = json.loads(text)
        return cls(
            scales={k: (float(v[0]), float(v[1])) for k, v in d["scales"].items()},
            classes=tuple(d["classes"]),
            target_mean=float(d["target_mean"]),
            target_std=float(d["target_std"]),
            train_rows=int(d["train_rows"]),
        )


def _mean_std(values: Floats) -> tuple[float, float]:
    if values.size == 0:
        return 0.0, 1.0
    mean, std = float(values.mean()), float(values.std())
    return mean, (std if std > 0 and np.isfinite(std) else 1.0)


def _train_mask(table: pa.Table) -> Bools:
    if TRAIN_COLUMN not in table.column_names:
        raise UserError(
            f"the preprocessed table has no '{TRAIN_COLUMN}' column (the train/validation split); "
            "build it with the harness's preprocess stage"
        )
    return np.asarray(_table_column(table, TRAIN_COLUMN).fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


def fit_stats(table: pa.Table, spec: Spec) -> Stats:
    """Means and standard deviations of every numeric and timestamp column (and the target's
    classes or scale) over the training split's rows: the rows under ``__train`` roots."""
    nodes = _nodes(spec)
    train = _train_mask(table)
    rows = _flatten(table, nodes)
    scales: dict[str, tuple[float, float]] = {}
    for node, r in zip(nodes, rows, strict=True):
        keep = train[r.context]
        for column, kind in node.columns:
            if kind not in ("numeric", "timestamp"):
                continue
            values, valid = _scalars(r.columns(column), kind, f"column '{column}' of '{node.name}'")
            scales[f"{node.name}.{column}"] = _mean_std(values[valid & keep])
    classes: tuple[str, ...] = ()
    mean, std = 0.0, 1.0
    target = spec.task.target
    if target in table.column_names:
        raw = _table_column(table, target).filter(pa.array(train))
        if spec.task.kind == "category":
            distinct = pc.unique(_strings(raw).drop_null())
            classes = tuple(sorted(str(v) for v in distinct.to_pylist()))
        elif spec.task.kind == "regression":
            values, valid = _numbers(raw, f"task.target '{target}'")
            mean, std = _mean_std(values[valid])
    return Stats(scales, classes, mean, std, int(train.sum()))


# --- contexts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Contexts:
    """Every context of one chunk as flat cell arrays, context-major (the columnar form the
    encode and collate steps read). Cells of context ``i``: ``offsets[i]:offsets[i + 1]``."""

    keys: pa.Array  # root keys, in the table's row order
    offsets: Int64s  # [contexts + 1]
    node: Int64s  # [cells]
    parents: Int64s  # [cells, MAX_PARENTS], -1 = no parent
    column: Int64s  # [cells] -> column_names
    table: Int64s  # [cells] -> node index (root 0, then branches in schema order)
    sem: npt.NDArray[np.int8]  # [cells] SEM_NUMBER / SEM_TEXT / SEM_DATETIME / SEM_BOOLEAN
    is_target: Bools  # [cells]
    number: npt.NDArray[np.float32]  # [cells] normalised; 0 where not a number cell
    datetime: npt.NDArray[np.float32]  # [cells]
    text: Int64s  # [cells] -> strings; -1 where not a text cell
    strings: pa.Array  # the chunk's distinct category/text values
    column_names: pa.Array  # "<column> of <table>" by column id
    labels: Floats  # [contexts]: class index (category), 0/1 (binary), normalised value; NaN = absent
    train: Bools  # [contexts]
    nodes_per_table: dict[str, int] = field(default_factory=dict)
    # [cells] boolean values (RT's boolean channel): the rt_utils builder's earlier labels of a
    # binary target (graph_contexts.py); None: no boolean cell carries a value (booleans are numbers)
    boolean: npt.NDArray[np.float32] | None = None

    @property
    def count(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> Int64s:
        """Cells per context (the target cell included)."""
        return np.diff(self.offsets)

    def label_tensors(self, rows: Sequence[int] | Int64s) -> tuple[torch.Tensor, torch.Tensor]:
        """``(labels, present)`` for ``rows`` in that order; absent labels are 0 and not present."""
        values = self.labels[np.asarray(rows, dtype=np.int64)]
        present = ~np.isnan(values)
        return torch.from_numpy(np.where(present, values, 0.0).astype(np.float32)), torch.from_numpy(present)


def _target_sem(kind: str) -> int:
    # A binary target is a boolean cell and a regression target a number cell: the published
    # model's mask embedding differs by semantic type. A category target is a text cell.
    return {"binary": SEM_BOOLEAN, "regression": SEM_NUMBER, "category": SEM_TEXT}[kind]


def unseen_classes(table: pa.Table, spec: Spec, stats: Stats) -> Bools:
    """[rows]: a category target's values that are known (not null) but none of the training
    classes (``stats.classes``), so the model has no index for them. Their label is absent for
    training and calibration (NaN in ``Contexts.labels``); quality counts them as wrong
    (``UNSEEN_CLASS``, model/batch.py)."""
    target = spec.task.target
    if spec.task.kind != "category" or target not in table.column_names:
        return np.zeros(table.num_rows, dtype=bool)
    raw = _table_column(table, target)
    idx = pc.index_in(_strings(raw), value_set=pa.array(stats.classes, pa.large_string()))
    known = raw.is_valid().to_numpy(zero_copy_only=False)
    return np.asarray(known & ~idx.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _labels(table: pa.Table, spec: Spec, stats: Stats) -> Floats:
    n = table.num_rows
    target = spec.task.target
    if target not in table.column_names:  # a chunk without labels (serving): predict only
        return np.full(n, np.nan)
    raw = _table_column(table, target)
    kind = spec.task.kind
    if kind == "category":
        idx = pc.index_in(_strings(raw), value_set=pa.array(stats.classes, pa.large_string()))
        values = idx.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
    elif kind == "binary":
        try:
            flags = raw if pa.types.is_boolean(raw.type) else raw.cast(pa.bool_())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise UserError(
                f"task.target '{target}' is binary but its values ({raw.type}) do not read as "
                f"booleans ({exc}); store it as bool, 0/1 or 'true'/'false', or use task.kind category"
            ) from exc
        values = flags.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
    else:
        values, valid = _numbers(raw, f"task.target '{target}'")
        values = np.where(valid, (values - stats.target_mean) / stats.target_std, np.nan)
    return np.asarray(values, dtype=np.float64)


@dataclass
class _Part:
    context: Int64s
    node: Int64s
    parents: Int64s
    column: int
    table: int
    sem: int
    target: bool
    number: npt.NDArray[np.float32] | None = None
    datetime: npt.NDArray[np.float32] | None = None
    text: Int64s | None = None  # positions in the concatenated string parts


def build_contexts(table: pa.Table, spec: Spec, stats: Stats, config: ContextConfig | None = None) -> Contexts:
    """One context per root row of the harness's preprocessed ``table`` (see the module doc)."""
    config = config or ContextConfig()
    nodes = _nodes(spec)
    if config.links == "ancestors":
        deep = [(n.name, n.depth) for n in nodes if n.depth > MAX_PARENTS]
        if deep:
            name, depth = deep[0]
            raise UserError(_too_many_parents(name, depth))
    rows = _flatten(table, nodes)
    n_roots = table.num_rows
    ids, links = _node_ids_and_links(nodes, rows, n_roots, config)
    parts, string_parts = _cell_parts(nodes, rows, ids, links, stats)
    # exactly one target cell per root row, whatever its label: a query, not an input
    parts.append(
        _Part(np.arange(n_roots, dtype=np.int64), ids[0], links[0], len(parts), 0, _target_sem(spec.task.kind), True)
    )
    return _assemble(parts, string_parts, n_roots, table, spec, stats, nodes, rows)


def _node_ids_and_links(
    nodes: list[_Node], rows: list[_Rows], n_roots: int, config: ContextConfig
) -> tuple[list[Int64s], list[Int64s]]:
    """Per node: its rows' node ids and their parent links ``[rows, MAX_PARENTS]`` (-1 = none)."""
    # node ids: a running offset per node over the chunk's rows, never a natural key
    offsets = np.cumsum([0, *(r.count for r in rows)])
    ids = [np.arange(r.count, dtype=np.int64) + offsets[k] for k, r in enumerate(rows)]
    links: list[Int64s] = [np.full((n_roots, MAX_PARENTS), -1, dtype=np.int64)]
    for k, node in enumerate(nodes[1:], start=1):
        up, parent_rows = node.parent, rows[k].parent
        own = np.full((rows[k].count, MAX_PARENTS), -1, dtype=np.int64)
        own[:, 0] = ids[up][parent_rows]
        if config.links == "ancestors":
            inherited = links[up][parent_rows]
            if (inherited[:, MAX_PARENTS - 1] >= 0).any():  # cannot happen after the depth check
                raise UserError(_too_many_parents(node.name, node.depth))
            own[:, 1:] = inherited[:, : MAX_PARENTS - 1]
        links.append(own)
    return ids, links


def _cell_parts(
    nodes: list[_Node], rows: list[_Rows], ids: list[Int64s], links: list[Int64s], stats: Stats
) -> tuple[list[_Part], list[pa.Array]]:
    """One part per (node, column): its present values' cells (column id = the part's index),
    and the kept strings of the text parts, in part order (their ``text`` positions index them)."""
    parts: list[_Part] = []
    string_parts: list[pa.Array] = []
    string_count = 0
    for k, (node, r) in enumerate(zip(nodes, rows, strict=True)):
        for column, kind in node.columns:
            where = f"column '{column}' of '{node.name}' (table '{node.table}')"
            arr = r.columns(column)
            if kind in ("numeric", "timestamp"):
                values, valid = _scalars(arr, kind, where)
                mean, std = stats.scales.get(f"{node.name}.{column}", (0.0, 1.0))
                keep = np.flatnonzero(valid)
                scaled = ((values[keep] - mean) / std).astype(np.float32)
                part = _Part(r.context[keep], ids[k][keep], links[k][keep], len(parts), k, SEM_NUMBER, False)
                if kind == "numeric":
                    part.number = scaled
                else:
                    part.sem, part.datetime = SEM_DATETIME, scaled
            else:  # category, text: a string vector
                text = _strings(arr)
                keep = np.flatnonzero(np.asarray(text.is_valid().to_numpy(zero_copy_only=False), dtype=bool))
                kept = text.take(pa.array(keep))
                string_parts.append(kept)
                part = _Part(r.context[keep], ids[k][keep], links[k][keep], len(parts), k, SEM_TEXT, False)
                part.text = np.arange(string_count, string_count + len(kept), dtype=np.int64)
                string_count += len(kept)
            parts.append(part)
    return parts, string_parts


def _assemble(
    parts: list[_Part],
    string_parts: list[pa.Array],
    n_roots: int,
    table: pa.Table,
    spec: Spec,
    stats: Stats,
    nodes: list[_Node],
    rows: list[_Rows],
) -> Contexts:
    """The parts' cells, context-major (within a context, schema order), as one ``Contexts``;
    the chunk's strings deduplicated (each distinct string is encoded once)."""
    if string_parts:
        encoded = pc.dictionary_encode(pa.concat_arrays(string_parts))
        strings = encoded.dictionary
        string_index = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    else:
        strings, string_index = pa.array([], pa.large_string()), np.zeros(0, dtype=np.int64)

    def gather(get: Callable[[_Part], Any], fill: Any, dtype: Any) -> Any:
        chunks = []
        for p in parts:
            v = get(p)
            n = len(p.context)
            chunks.append(np.full(n, fill, dtype=dtype) if v is None else np.asarray(v, dtype=dtype))
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=dtype)

    context = np.concatenate([p.context for p in parts])
    order = np.argsort(context, kind="stable")  # context-major; within a context, schema order
    text_pos = gather(lambda p: p.text, -1, np.int64)
    text = np.where(text_pos >= 0, string_index[np.maximum(text_pos, 0)] if string_index.size else -1, -1)
    counts = np.bincount(context, minlength=n_roots)
    return Contexts(
        keys=_table_column(table, spec.schema_.root.key),
        offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        node=np.concatenate([p.node for p in parts])[order],
        parents=np.concatenate([p.parents for p in parts])[order],
        column=gather(lambda p: np.full(len(p.context), p.column), 0, np.int64)[order],
        table=gather(lambda p: np.full(len(p.context), p.table), 0, np.int64)[order],
        sem=gather(lambda p: np.full(len(p.context), p.sem), 0, np.int8)[order],
        is_target=gather(lambda p: np.full(len(p.context), p.target), False, np.bool_)[order],
        number=gather(lambda p: p.number, 0.0, np.float32)[order],
        datetime=gather(lambda p: p.datetime, 0.0, np.float32)[order],
        text=text[order].astype(np.int64),
        strings=strings,
        column_names=pa.array(_column_names(nodes, spec), pa.large_string()),
        labels=_labels(table, spec, stats),
        train=_train_mask(table),
        nodes_per_table={n.name: r.count for n, r in zip(nodes, rows, strict=True)},
    )


def _too_many_parents(branch: str, depth: int) -> str:
    return (
        f"model.library relational_transformers: branch '{branch}' is {depth} foreign-key hops below "
        f"the root, so with ancestor links its rows would carry {depth} parent node ids; RT-J reads at "
        f"most {MAX_PARENTS} per cell (f2p_nbr_idxs). Use parent links (one parent per row), or nest "
        f"'{branch}' at most {MAX_PARENTS} levels deep"
    )


# --- encode: strings -> 384-wide vectors ---------------------------------------------------

_FNV_PRIME = np.uint64(0x100000001B3)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix(z: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _hash_tokens(tokens: pa.Array, salt: int) -> npt.NDArray[np.uint64]:
    """One 64-bit hash per token's UTF-8 bytes: a polynomial over the bytes (mod 2^64), its
    length and a salt, through splitmix64's finaliser. Vectorised over the whole buffer."""
    binary = tokens.cast(pa.large_binary())
    n = len(binary)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    buffers = binary.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[binary.offset : binary.offset + n + 1]
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    start, end = offsets[:-1], offsets[1:]
    total = int(end[-1] - start[0])
    h = np.zeros(n, dtype=np.uint64)
    if total:
        byte_pos = np.arange(start[0], end[-1], dtype=np.int64)
        owner = np.repeat(np.arange(n), lengths)
        exponent = end[owner] - 1 - byte_pos
        powers = np.concatenate([[np.uint64(1)], np.cumprod(np.full(int(lengths.max()), _FNV_PRIME))])
        with np.errstate(over="ignore"):
            contrib = (data[byte_pos].astype(np.uint64) + np.uint64(1)) * powers[exponent]
        nonempty = lengths > 0
        h[nonempty] = np.add.reduceat(contrib, (start[nonempty] - start[0]).astype(np.int64))
    with np.errstate(over="ignore"):
        h = h + lengths.astype(np.uint64) * _GOLDEN + np.uint64(salt) * np.uint64(0xD6E8FEB86659FD93)
        return _splitmix(h)


def _token_vectors(hashes: npt.NDArray[np.uint64], width: int) -> npt.NDArray[np.float32]:
    """A pseudo-random vector in [-1, 1)^width per token hash (splitmix64 of hash + j * golden)."""
    steps = (np.arange(1, width + 1, dtype=np.uint64) * _GOLDEN)[None, :]
    out = np.empty((len(hashes), width), dtype=np.float32)
    block = 4096  # bounds the [block, width] uint64 temporaries
    with np.errstate(over="ignore"):
        for s in range(0, len(hashes), block):
            bits = _splitmix(hashes[s : s + block, None] + steps) >> np.uint64(40)
            out[s : s + block] = bits.astype(np.float32) * np.float32(2.0 / (1 << 24)) - np.float32(1.0)
    return out


def hashing_encoder(strings: pa.Array, width: int = D_TEXT) -> npt.NDArray[np.float32]:
    """Deterministic stand-in for all-MiniLM-L12-v2 (not reachable here): each string is the
    L2-normalised sum of pseudo-random vectors of its exact bytes and of its lower-cased
    whitespace-separated words. Strings that share words point in similar directions; no
    weights, no download. It serves the pipeline's shape and the encode step's place in the
    timing, not pretrained quality, and costs far less than a transformer encoder would."""
    strings = _strings(strings)
    n = len(strings)
    if n == 0:
        return np.zeros((0, width), dtype=np.float32)
    words = pc.utf8_split_whitespace(pc.utf8_lower(strings))
    flat_words = pc.list_flatten(words)
    word_owner = np.array(pc.list_parent_indices(words).to_numpy(zero_copy_only=False), dtype=np.int64)
    out = torch.from_numpy(_token_vectors(_hash_tokens(strings, 1), width))
    if len(flat_words):
        vectors = torch.from_numpy(_token_vectors(_hash_tokens(flat_words, 2), width))
        out.index_add_(0, torch.from_numpy(word_owner), vectors)
    out = torch.nn.functional.normalize(out, dim=1)
    return cast(npt.NDArray[np.float32], out.numpy())


@dataclass(frozen=True)
class Encoded:
    values: torch.Tensor  # [distinct strings, d_text] float32
    columns: torch.Tensor  # [column ids, d_text] float32

    @property
    def strings_encoded(self) -> int:
        return int(self.values.shape[0]) + int(self.columns.shape[0])


def _run_encoder(encoder: Encoder, strings: pa.Array, name: str) -> torch.Tensor:
    out = np.asarray(encoder(strings), dtype=np.float32)
    if out.shape != (len(strings), D_TEXT):
        raise UserError(
            f"the cell encoder {name} returned shape {out.shape} for {len(strings)} strings; RT-J reads "
            f"{D_TEXT}-wide vectors: return float32 [n, {D_TEXT}]"
        )
    bad = ~np.isfinite(out).all(axis=1)
    if bad.any():
        first = strings[int(np.flatnonzero(bad)[0])].as_py()
        raise UserError(
            f"the cell encoder {name} returned non-finite values for {int(bad.sum())} strings (first: "
            f"{first!r}); the library refuses non-finite embeddings: fix the encoder"
        )
    return torch.from_numpy(out)


def encode(contexts: Contexts, encoder: Encoder = hashing_encoder) -> Encoded:
    """The encode step: each distinct category/text value and each column name -> a vector,
    once per chunk (a string used in many cells is encoded once and gathered in collate)."""
    name = getattr(encoder, "__qualname__", repr(encoder))
    return Encoded(
        values=_run_encoder(encoder, contexts.strings, name),
        columns=_run_encoder(encoder, contexts.column_names, name),
    )


# --- collate ---------------------------------------------------------------------------------


def collate(contexts: Contexts, encoded: Encoded, rows: Sequence[int] | Int64s) -> RelationalBatch:
    """The library's ``RelationalBatch`` for contexts ``rows`` (batch row ``b`` = context
    ``rows[b]``), padded to the longest of them as the library's own collation pads."""
    rows = np.asarray(rows, dtype=np.int64)
    starts = contexts.offsets[rows]
    lengths = contexts.offsets[rows + 1] - starts
    b, s = len(rows), max(int(lengths.max(initial=0)), 1)
    first = np.cumsum(lengths) - lengths
    within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(first, lengths)
    cell = np.repeat(starts, lengths) + within
    slot = torch.from_numpy(np.repeat(np.arange(b, dtype=np.int64), lengths) * s + within)

    def place(values: npt.NDArray[Any], fill: float | bool, dtype: torch.dtype) -> torch.Tensor:
        src = torch.from_numpy(np.ascontiguousarray(values))
        out = torch.full((b * s, *src.shape[1:]), fill, dtype=dtype)
        out[slot] = src.to(dtype)
        return out.view(b, s, *src.shape[1:])

    text_ids = contexts.text[cell]
    has_text = text_ids >= 0
    text_values = torch.zeros(b * s, D_TEXT)
    if has_text.any():
        text_values[slot[torch.from_numpy(has_text)]] = encoded.values[torch.from_numpy(text_ids[has_text])]
    col_values = torch.zeros(b * s, D_TEXT)
    col_values[slot] = encoded.columns[torch.from_numpy(contexts.column[cell])]
    batch = RelationalBatch(
        node_idxs=place(contexts.node[cell], 0, torch.int64),
        f2p_nbr_idxs=place(contexts.parents[cell], -1, torch.int64),
        col_name_idxs=place(contexts.column[cell], 0, torch.int64),
        table_name_idxs=place(contexts.table[cell], 0, torch.int64),
        is_padding=place(np.zeros(len(cell), dtype=bool), True, torch.bool),
        sem_types=place(contexts.sem[cell], 0, torch.int64),
        is_targets=place(contexts.is_target[cell], False, torch.bool),
        number_values=place(contexts.number[cell][:, None], 0.0, torch.float32),
        datetime_values=place(contexts.datetime[cell][:, None], 0.0, torch.float32),
        boolean_values=torch.zeros(b, s, 1)
        if contexts.boolean is None
        else place(contexts.boolean[cell][:, None], 0.0, torch.float32),
        text_values=text_values.view(b, s, D_TEXT),
        col_name_values=col_values.view(b, s, D_TEXT),
    )
    targets = batch.is_targets.sum(1)
    if not bool((targets == 1).all()):  # an invariant of build_contexts, checked where it matters
        raise RuntimeError(f"a context carries {int(targets.max())} or {int(targets.min())} target cells, not 1")
    return batch


def cells_present(batch: RelationalBatch) -> int:
    """Cells that are real inputs (the target cell included)."""
    return int((~batch.is_padding).sum())


def cells_padded(batch: RelationalBatch) -> int:
    """Cells the batch materialises: batch x longest context."""
    return int(batch.is_padding.numel())


def planned_cells(lengths: Int64s, plan: Sequence[Int64s]) -> tuple[int, int]:
    """``(cells_present, cells_padded)`` summed over the batches ``collate`` would build for
    ``plan``, from the context lengths alone (no batch is built): present = the lengths,
    padded = batch x its longest context (at least 1, as ``collate`` pads)."""
    if not plan:
        return 0, 0
    sizes = np.array([len(idx) for idx in plan], dtype=np.int64)
    cat = lengths[np.concatenate(plan)]
    longest = np.maximum.reduceat(cat, np.cumsum(sizes) - sizes) if cat.size else np.zeros(0, np.int64)
    return int(cat.sum()), int((sizes * np.maximum(longest, 1)).sum())


# --- batch plans ------------------------------------------------------------------------------


def plan_batches(
    lengths: Int64s,
    batch_size: int,
    bucketing: Literal["off", "by_length"] = "off",
    bucket_count: int = 8,
    shuffle_seed: int | None = None,
) -> list[Int64s]:
    """Context indices per batch. ``off``: natural order (shuffled when training). ``by_length``:
    contexts sorted by length (stable) and cut into ``bucket_count`` groups of whole batches,
    so each batch pads only to lengths like its own; training shuffles within each group and
    then the order of the full batches (the one partial batch stays last). A context is never
    split: one target and its whole neighbourhood per batch row."""
    n = len(lengths)
    rng = np.random.default_rng(shuffle_seed) if shuffle_seed is not None else None
    if bucketing == "off":
        order = rng.permutation(n) if rng is not None else np.arange(n)
        return [order[i : i + batch_size].astype(np.int64) for i in range(0, n, batch_size)]
    order = np.argsort(lengths, kind="stable").astype(np.int64)
    n_batches = -(-n // batch_size)
    groups = [g for g in np.array_split(np.arange(n_batches), min(bucket_count, max(n_batches, 1))) if len(g)]
    batches: list[Int64s] = []
    for g in groups:
        members = order[g[0] * batch_size : min((g[-1] + 1) * batch_size, n)]
        if rng is not None:
            members = rng.permutation(members)
        batches.extend(members[i : i + batch_size] for i in range(0, len(members), batch_size))
    if rng is not None:
        full = [bt for bt in batches if len(bt) == batch_size]
        partial = [bt for bt in batches if len(bt) != batch_size]
        batches = [full[i] for i in rng.permutation(len(full))] + partial
    return batches
