"""Arrow -> model batches, vectorised.

Input: one Arrow row per root key; each branch is a ``list<struct>`` column on its parent
(nested to any depth), children already ordered and truncated to ``max_length``.

Flattening walks list offsets, never rows: for a list column with per-parent counts ``n``,
the children's parent index is ``repeat(arange(P), n)`` and their slot is
``arange(total) - starts[parent]``. Chained over levels this gives every branch row its
coordinates ``(root, slot_1, ..., slot_d)`` in the padded ``[B, L1, ..., Ld]`` layout, and
values are scattered in with one fancy-index assignment per column.

``Encoding`` is what is fitted on the training split (category vocabularies, numeric and
timestamp standardisation, label classes). It is plain JSON so it travels in checkpoints.
Unseen categories map to the unknown index, nulls to the null index.

Text cells arrive already encoded: the application's encoder (outside the model, before
this module) replaces each ``text`` column by a ``fixed_size_list<float32, E>`` column of the
same rows; a null list entry is a null text cell. ``encode`` scatters those vectors into
``text_RXE`` the way it scatters every other column.

``encode(..., lengths=...)`` pads each branch to a given length instead of ``max_length``
(length bucketing); ``encode_trimmed`` pads each branch to the slice's own longest instance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from model.batch import UNSEEN_CLASS, Batch, NodeTensors
from model.schema import (
    NULL_INDEX,
    RESERVED_CATEGORY_SLOTS,
    UNKNOWN_INDEX,
    ColumnDef,
    ModelSchema,
    NodeDef,
    TargetDef,
)


@dataclass(frozen=True)
class NodeLayout:
    """Spec-side description of one node: which Arrow columns feed it."""

    name: str
    columns: dict[str, str]  # column -> kind (numeric | category | timestamp)
    max_length: int = 1
    reduce: str = "mean"
    children: tuple[NodeLayout, ...] = ()


@dataclass
class Encoding:
    vocab: dict[str, list[str]] = field(default_factory=dict)  # "node.column" -> values
    mean: dict[str, float] = field(default_factory=dict)
    std: dict[str, float] = field(default_factory=dict)
    classes: list[str] = field(default_factory=list)  # category target labels
    target_mean: float = 0.0
    target_std: float = 1.0
    text_width: int = 0  # width of the text vectors (0: no text columns)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Encoding:
        return cls(**d)


@dataclass
class NodeRows:
    """The flat rows of one node and where each sits in the padded layout."""

    values: pa.Table | pa.StructArray
    index: tuple[np.ndarray, ...]  # (root, slot_1, ..., slot_d), one entry per flat row

    def column(self, name: str) -> pa.Array:
        col = self.values.field(name) if isinstance(self.values, pa.StructArray) else self.values[name]
        if isinstance(col, pa.ChunkedArray):
            # one chunk (the usual case) is used in place; combine_chunks would copy it
            return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        return col


def flatten(table: pa.Table, root: NodeLayout) -> dict[str, NodeRows]:
    """Every node's flat rows with their padded coordinates, parents before children."""
    out = {root.name: NodeRows(table, (np.arange(table.num_rows),))}
    # A stack (the same parents-first order as recursion), not a recursive closure: that put
    # every flattened row in a reference cycle, alive until the cyclic garbage collector ran.
    todo = [(child, root.name) for child in reversed(root.children)]
    while todo:
        node, parent_name = todo.pop()
        rows = out[parent_name]
        lists = rows.column(node.name)
        counts = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
        parent = np.repeat(np.arange(len(lists)), counts)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        slot = np.arange(int(counts.sum()), dtype=np.int64) - starts[parent]
        flat = pc.list_flatten(lists)
        if isinstance(flat, pa.ChunkedArray):
            flat = flat.combine_chunks()
        out[node.name] = NodeRows(flat, tuple(i[parent] for i in rows.index) + (slot,))
        todo.extend((child, node.name) for child in reversed(node.children))
    return out


def _as_float(arr: pa.Array, kind: str) -> np.ndarray:
    """Numeric / timestamp Arrow values as float64 with NaN for nulls."""
    if kind == "timestamp":
        if pa.types.is_date(arr.type):
            arr = arr.cast(pa.date32()).cast(pa.int32())
            scale = 1.0  # days
        else:
            # ticks in the column's own unit: a cast to seconds fails on sub-second values,
            # and ns ticks exceed 2**53, so the float cast is unchecked
            scale = 86_400.0 * {"s": 1, "ms": 1e3, "us": 1e6, "ns": 1e9}[arr.type.unit]
            arr = arr.cast(pa.int64()).cast(pa.float64(), safe=False)
        out = arr.cast(pa.float64()).to_numpy(zero_copy_only=False) / scale
    else:
        # integers beyond 2**53 (ids, hashes declared numeric) round to the nearest float: a
        # checked cast would refuse the whole column
        out = arr.cast(pa.float64(), safe=not pa.types.is_integer(arr.type)).to_numpy(zero_copy_only=False)
    return np.asarray(out, dtype=np.float64)


def _as_text(arr: pa.Array) -> pa.Array:
    return arr if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type) else arr.cast(pa.string())


def _category_index(arr: pa.Array, vocab: list[str]) -> np.ndarray:
    if pa.types.is_dictionary(arr.type):
        if len(arr.dictionary) > len(arr):  # fewer cells than values: hash the cells
            return _category_index(arr.cast(arr.type.value_type), vocab)
        # each distinct value hashed once, then one gather by the cells' indices
        codes = np.append(_category_index(arr.dictionary, vocab), NULL_INDEX)  # last: null cell
        idx = pc.fill_null(arr.indices, len(arr.dictionary)).to_numpy(zero_copy_only=False)
        gathered: np.ndarray = codes[idx]
        return gathered
    text = _as_text(arr)
    idx = pc.index_in(text, value_set=pa.array(vocab, pa.string()))  # null: unseen or null
    # one pass over the indices where the cells have no nulls (the null mask only when some are)
    filled = pc.fill_null(idx, UNKNOWN_INDEX - RESERVED_CATEGORY_SLOTS).to_numpy(zero_copy_only=False)
    out: np.ndarray = filled.astype(np.int64) + RESERVED_CATEGORY_SLOTS
    if text.null_count:
        out[text.is_null().to_numpy(zero_copy_only=False)] = NULL_INDEX
    return out


def _distinct_text(arr: pa.Array) -> list[str]:
    """Sorted distinct non-null values as text (a dictionary column: the values its cells use)."""
    if pa.types.is_dictionary(arr.type):
        arr = pc.unique(arr).cast(arr.type.value_type)  # unique first: decodes the distinct cells only
    return sorted(pc.unique(_as_text(arr)).drop_null().to_pylist())


def fit_encoding(table: pa.Table, root: NodeLayout, target: TargetDef) -> Encoding:
    """Vocabularies, standardisation and label classes from (training) rows."""
    enc = Encoding()
    rows = flatten(table, root)
    for node in _walk(root):
        for col, kind in node.columns.items():
            if node.name == target.node and col == target.column:
                continue
            arr = rows[node.name].column(col)
            key = f"{node.name}.{col}"
            if kind == "category":
                enc.vocab[key] = _distinct_text(arr)
            elif kind == "text":
                enc.text_width = text_width(arr, key)
            else:
                vals = _as_float(arr, kind)
                vals = vals[~np.isnan(vals)]
                enc.mean[key] = float(vals.mean()) if vals.size else 0.0
                std = float(vals.std()) if vals.size else 1.0
                enc.std[key] = std if std > 0 else 1.0
    labels = rows[target.node].column(target.column)
    if target.kind == "category":
        enc.classes = _distinct_text(labels)
    elif target.kind == "regression":
        vals = _as_float(labels, "numeric")
        vals = vals[~np.isnan(vals)]
        if vals.size:
            enc.target_mean = float(vals.mean())
            enc.target_std = float(vals.std()) or 1.0
    return enc


def _walk(node: NodeLayout) -> list[NodeLayout]:
    out = [node]
    for c in node.children:
        out.extend(_walk(c))
    return out


def model_schema(root: NodeLayout, target: TargetDef, enc: Encoding) -> ModelSchema:
    """The model's view: column kinds and category cardinalities, no table names."""

    def build(node: NodeLayout) -> NodeDef:
        cols = []
        for col, kind in node.columns.items():
            if node.name == target.node and col == target.column:
                cols.append(ColumnDef(col, "numeric"))  # a learned-mask coordinate
            elif kind == "category":
                cols.append(ColumnDef(col, "category", len(enc.vocab[f"{node.name}.{col}"]) + RESERVED_CATEGORY_SLOTS))
            elif kind == "text":
                cols.append(ColumnDef(col, "text", width=enc.text_width))
            else:
                cols.append(ColumnDef(col, kind))  # type: ignore[arg-type]
        return NodeDef(
            node.name,
            tuple(cols),
            node.max_length,
            node.reduce,  # type: ignore[arg-type]
            tuple(build(c) for c in node.children),
        )

    num_classes = len(enc.classes) if target.kind == "category" else 1
    return ModelSchema(build(root), TargetDef(target.node, target.column, target.kind, num_classes))


def text_width(arr: pa.Array, where: str) -> int:
    """Width E of an encoded text column (``fixed_size_list<float32, E>``)."""
    if not pa.types.is_fixed_size_list(arr.type):
        raise ValueError(
            f"text column {where} holds {arr.type}, not encoded vectors; run the application's "
            "text encoder on the table first (it replaces each text column by its vectors)"
        )
    return int(arr.type.list_size)


def _text_matrix(arr: pa.Array, where: str) -> tuple[np.ndarray, np.ndarray]:
    """``fixed_size_list<float, E>`` -> (float32 [n, E], null mask [n]), from the buffers."""
    E = text_width(arr, where)
    values = arr.values.slice(arr.offset * E, len(arr) * E)
    matrix = values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False).reshape(len(arr), E)
    return matrix, arr.is_null().to_numpy(zero_copy_only=False)


def _own_lengths(rows: dict[str, NodeRows], schema: ModelSchema) -> dict[str, int]:
    """Each branch's longest instance in these rows (at least 1)."""
    return {
        n.name: max(int(rows[n.name].index[-1].max()) + 1 if rows[n.name].index[-1].size else 1, 1)
        for n in schema.root.walk()[1:]
    }


def encode_trimmed(table: pa.Table, schema: ModelSchema, layout: NodeLayout, enc: Encoding) -> Batch:
    """``encode`` with every branch padded to the table's own longest instance, not ``max_length``."""
    return encode(table, schema, layout, enc, lengths=_own_lengths(flatten(table, layout), schema))


def _positions(index: tuple[np.ndarray, ...], shape: tuple[int, ...]) -> np.ndarray | None:
    """Each flat row's linear position in the padded ``shape`` layout, or None for the root
    (its flat rows are its rows, in order: ``flatten``). Computed by hand, 5x cheaper than
    ``np.ravel_multi_index``, so the bounds it would check are checked here."""
    if len(index) == 1:
        return None
    flat = index[0].astype(np.int64, copy=True)
    for axis, (idx, dim) in enumerate(zip(index[1:], shape[1:], strict=True), start=1):
        if idx.size and int(idx.max()) >= dim:
            raise IndexError(f"a row sits at slot {int(idx.max())} of axis {axis}, past the padded length {dim}")
        flat *= dim
        flat += idx
    return flat


def _place(rows: np.ndarray, flat: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    """One node's per-row values (``rows[i]`` for flat row i) in the padded ``shape`` layout,
    zeros elsewhere: one write at the rows' linear positions ``flat``, or the rows themselves
    where they fill every position in order (``flat`` None: the root)."""
    tail = rows.shape[1:]
    if flat is None:
        same = rows.flags.c_contiguous and rows.flags.writeable
        return (rows if same else np.array(rows, order="C")).reshape(*shape, *tail)
    out = np.zeros((int(np.prod(shape)), *tail), dtype=rows.dtype)
    width = int(np.prod(tail)) * rows.itemsize
    if rows.ndim == 1 or width == 0 or not len(rows):
        out[flat] = rows
    else:
        # each row as one opaque item: numpy's fancy write of [n, C] rows moves C elements per
        # row one by one (2-6x slower here); the bytes moved are the same
        item = np.dtype((np.void, width))
        src = np.ascontiguousarray(rows).reshape(len(rows), -1).view(item)[:, 0]
        out.reshape(len(out), -1).view(item)[flat, 0] = src
    return out.reshape(*shape, *tail)


def encode(
    table: pa.Table, schema: ModelSchema, layout: NodeLayout, enc: Encoding, lengths: dict[str, int] | None = None
) -> Batch:
    """Arrow rows -> padded tensors with presence, null and category encodings.

    ``lengths``: padded length per branch (default: each branch's reserved ``max_length``);
    must cover every present row.

    Each node's columns are gathered into one [rows, columns] array and written into the
    padded layout at once, at linear positions computed once per node: a write per column
    with the (root, slot...) index tuple made numpy ravel the tuple again for every column
    and cost most of this function on the default workload."""
    rows = flatten(table, layout)
    batch_size = table.num_rows
    nodes: dict[str, NodeTensors] = {}
    target = schema.target
    labels = label_present = None
    for node in schema.root.walk():
        r = rows[node.name]
        dims = schema.reserved_shape(node.name)
        if lengths is not None:
            dims = tuple(lengths[n.name] for n in schema.path(node.name)[1:])
        shape = (batch_size, *dims)
        n = len(r.index[0])
        flat = _positions(r.index, shape)
        cont_cols, cat_cols = node.continuous, node.categorical
        # column-major while filling (a strided, casting write per column cost 5x the
        # arithmetic), rows made contiguous once when placed
        cont = np.zeros((len(cont_cols), n), dtype=np.float32)
        cont_null = np.zeros((len(cont_cols), n), dtype=bool)
        for j, c in enumerate(cont_cols):
            if node.name == target.node and c.name == target.column:
                continue  # placeholder: the model replaces it with the learned mask vector
            key = f"{node.name}.{c.name}"
            vals = _as_float(r.column(c.name), c.kind)
            nulls = np.isnan(vals)
            cont[j] = np.where(nulls, 0.0, (vals - enc.mean[key]) / enc.std[key])
            cont_null[j] = nulls
        cat = np.zeros((len(cat_cols), n), dtype=np.int64)
        for j, c in enumerate(cat_cols):
            cat[j] = _category_index(r.column(c.name), enc.vocab[f"{node.name}.{c.name}"])
        text = text_null = None
        if node.text:
            E = node.text[0].width
            text_np = np.zeros((n, len(node.text), E), dtype=np.float32)
            text_null_np = np.zeros((n, len(node.text)), dtype=bool)
            for j, c in enumerate(node.text):
                matrix, nulls = _text_matrix(r.column(c.name), f"{node.name}.{c.name}")
                text_np[:, j] = np.where(nulls[:, None], 0.0, matrix)
                text_null_np[:, j] = nulls
            text = torch.from_numpy(_place(text_np, flat, shape))
            text_null = torch.from_numpy(_place(text_null_np, flat, shape))
        nodes[node.name] = NodeTensors(
            present=torch.from_numpy(_place(np.ones(n, dtype=bool), flat, shape)),
            continuous=torch.from_numpy(_place(cont.T, flat, shape)),
            continuous_null=torch.from_numpy(_place(cont_null.T, flat, shape)),
            categorical=torch.from_numpy(_place(cat.T, flat, shape)),
            text=text,
            text_null=text_null,
        )
        if node.name == target.node:
            raw = r.column(target.column)
            if target.kind == "category":
                idx = pc.index_in(_as_text(raw), value_set=pa.array(enc.classes, pa.string()))
                ok = idx.is_valid().to_numpy(zero_copy_only=False)
                values = pc.fill_null(idx, 0).to_numpy(zero_copy_only=False).astype(np.int64)
                # a value outside the fit's classes: not trained on, scored as wrong (model/batch.py)
                values[~ok & raw.is_valid().to_numpy(zero_copy_only=False)] = UNSEEN_CLASS
            else:
                if target.kind == "binary":
                    raw = raw.cast(pa.bool_()) if not pa.types.is_boolean(raw.type) else raw
                    vals = raw.cast(pa.float64()).to_numpy(zero_copy_only=False)
                else:
                    vals = (_as_float(raw, "numeric") - enc.target_mean) / enc.target_std
                vals = np.asarray(vals, dtype=np.float64)
                ok = ~np.isnan(vals)
                values = np.where(ok, vals, 0.0).astype(np.float32)
            labels = _place(values, flat, shape)
            label_present = _place(np.asarray(ok, dtype=bool), flat, shape)
    assert labels is not None and label_present is not None
    return Batch(nodes=nodes, labels=torch.from_numpy(labels), label_present=torch.from_numpy(label_present))


def coordinate_counts(batch: Batch, schema: ModelSchema) -> tuple[int, int]:
    """(present, reserved) coordinates: cells of present rows vs cells of reserved rows.

    Null and learned-mask cells are present; padding and structurally skipped cells are not.
    """
    return mask_coordinate_counts(present_masks(batch, schema))


def present_masks(batch: Batch, schema: ModelSchema) -> list[tuple[int, torch.Tensor]]:
    """(cells per row, present mask) of every node, in walk order: what ``coordinate_counts``
    reads, by reference (no reduction, no host copy), so a timed loop can keep them and count
    after its timing with ``mask_coordinate_counts``."""
    return [(len(node.columns), batch.nodes[node.name].present) for node in schema.root.walk()]


def mask_coordinate_counts(masks: list[tuple[int, torch.Tensor]]) -> tuple[int, int]:
    """``coordinate_counts`` from ``present_masks``' pairs (a host copy per node on CUDA)."""
    present = reserved = 0
    for cells, p in masks:
        # numpy, not torch: torch's threaded reduction of a small bool tensor costs ~1000x
        # more (thread wake-ups; far worse on a busy host) for the same count
        present += int(np.count_nonzero(p.cpu().numpy())) * cells
        reserved += p.numel() * cells
    return present, reserved


def arrow_coordinate_counts(table: pa.Table, schema: ModelSchema, layout: NodeLayout) -> tuple[int, int]:
    """``coordinate_counts`` from list offsets alone, without encoding the values."""
    rows = flatten(table, layout)
    present = reserved = 0
    for node in schema.root.walk():
        cells = len(node.columns)
        present += len(rows[node.name].index[0]) * cells
        slots = table.num_rows
        for n in schema.path(node.name)[1:]:
            slots *= n.max_length
        reserved += slots * cells
    return present, reserved
