"""Length bucketing: batches of roots with similar context sizes, each padded only as far as it
needs.

The seed note: collation pads every context in a batch to the longest one and attention cost
grows quadratically with the padded length, so "one 400-cell context in a batch of 50-cell
contexts makes the whole batch pay 400-cell prices". Without bucketing every batch is padded
to the schema's reserved shape (``max_length`` of every branch) and batches follow key order.

Design choices:
- A root's *context size* is its total present cells (present rows x columns, over every
  node). Roots are sorted by it (stable, so ties keep key order) and cut into
  ``bucket_count`` equal-count buckets whose sizes are multiples of the batch size, so only
  the last batch of the last bucket can be partial. A batch row is always one whole root:
  a root and its complete relational neighbourhood are never split across batches.
- Each batch is padded per branch to the longest instance it holds (``pad_to="batch"``), or
  to the longest instance of its bucket (``pad_to="bucket"``: compiled regions then see at
  most ``bucket_count`` branch shapes, which bounds recompiles).
- Trimming slices the chunk's padded tensors first and gathers the batch rows second, so
  only the trimmed region is ever copied: what the model gets is what is materialised.
- Training shuffles rows within each bucket and then the order of full batches with the
  caller's generator (the run's seed), so batches are not sorted by size; the one partial
  batch stays last (the loader path cuts fixed-size ranges from the planned order).
- Outputs of trimmed batches are padded back to the reserved shape with zeros (outputs at
  absent rows are not meaningful either way), and ``restore_order`` puts rows back in the
  original order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

import numpy as np
import torch

from .batch import Batch, NodeTensors
from .schema import ModelSchema

PadTo = Literal["batch", "bucket"]


@dataclass
class RootShapes:
    """Per root row of a chunk: present cells and, per branch, its longest instance."""

    cells: np.ndarray  # int64 [B]
    lengths: dict[str, np.ndarray]  # branch name -> int64 [B]


@dataclass(frozen=True)
class PlannedBatch:
    rows: torch.Tensor  # int64 [b]: root rows of the chunk, in batch order
    lengths: dict[str, int]  # branch name -> padded length of this batch
    bucket: int


def root_shapes(batch: Batch, schema: ModelSchema) -> RootShapes:
    """``RootShapes`` from the presence masks of an encoded chunk."""
    B = batch.size
    cells = np.zeros(B, dtype=np.int64)
    lengths: dict[str, np.ndarray] = {}
    for node in schema.root.walk():
        present = batch.nodes[node.name].present
        cells += present.reshape(B, -1).sum(1).numpy().astype(np.int64) * len(node.columns)
        if node is not schema.root:
            # present rows are a prefix of each instance: its length is its present count
            lengths[node.name] = present.sum(-1).reshape(B, -1).amax(1).numpy().astype(np.int64)
    return RootShapes(cells, lengths)


def arrow_root_shapes(rows_by_node: dict[str, Any], schema: ModelSchema, num_rows: int) -> RootShapes:
    """``RootShapes`` from ``model.arrow.flatten`` output (list offsets only, no values)."""
    cells = np.zeros(num_rows, dtype=np.int64)
    lengths: dict[str, np.ndarray] = {}
    for node in schema.root.walk():
        index = rows_by_node[node.name].index
        cells += np.bincount(index[0], minlength=num_rows).astype(np.int64) * len(node.columns)
        if node is not schema.root:
            longest = np.zeros(num_rows, dtype=np.int64)
            np.maximum.at(longest, index[0], index[-1] + 1)
            lengths[node.name] = longest
    return RootShapes(cells, lengths)


def _lengths(shapes: RootShapes, rows: np.ndarray) -> dict[str, int]:
    # at least one slot: an all-empty branch keeps a [.., 1] axis instead of a zero-size one
    return {name: max(int(v[rows].max()) if rows.size else 1, 1) for name, v in shapes.lengths.items()}


def plan(
    shapes: RootShapes,
    rows: torch.Tensor,
    batch_size: int,
    bucket_count: int,
    generator: torch.Generator | None = None,
    pad_to: PadTo = "batch",
) -> list[PlannedBatch]:
    """Batches over root ``rows`` grouped by context size; shuffled when ``generator`` is given."""
    rows_np = rows.numpy()
    order = rows_np[np.argsort(shapes.cells[rows_np], kind="stable")]
    n = order.size
    per_bucket = math.ceil(math.ceil(n / batch_size) / bucket_count) * batch_size if n else 1
    out: list[PlannedBatch] = []
    for b, start in enumerate(range(0, n, per_bucket)):
        members = order[start : start + per_bucket]
        if generator is not None:
            members = members[torch.randperm(members.size, generator=generator).numpy()]
        bucket_lengths = _lengths(shapes, members) if pad_to == "bucket" else None
        for i in range(0, members.size, batch_size):
            part = members[i : i + batch_size]
            out.append(
                PlannedBatch(torch.from_numpy(np.ascontiguousarray(part)), bucket_lengths or _lengths(shapes, part), b)
            )
    if generator is not None:
        full = [p for p in out if p.rows.numel() == batch_size]
        rest = [p for p in out if p.rows.numel() != batch_size]
        out = [full[i] for i in torch.randperm(len(full), generator=generator).tolist()] + rest
    return out


def _trimmed(t: torch.Tensor | None, dims: list[int], rows: torch.Tensor) -> torch.Tensor | None:
    if t is None:
        return None
    return t[(slice(None), *(slice(0, d) for d in dims))][rows]


def node_dims(schema: ModelSchema, name: str, lengths: dict[str, int]) -> list[int]:
    """Padded dims after the batch dim of node ``name`` for the planned ``lengths``."""
    return [lengths[n.name] for n in schema.path(name)[1:]]


def take(batch: Batch, schema: ModelSchema, rows: torch.Tensor, lengths: dict[str, int]) -> Batch:
    """Root ``rows`` of ``batch``, every branch cut to ``lengths`` (slice first, then copy)."""
    nodes = {}
    for node in schema.root.walk():
        dims = node_dims(schema, node.name, lengths)
        t = batch.nodes[node.name]
        trimmed: dict[str, Any] = {f.name: _trimmed(getattr(t, f.name), dims, rows) for f in fields(NodeTensors)}
        nodes[node.name] = replace(t, **trimmed)
    dims = node_dims(schema, schema.target.node, lengths)
    labels, label_present = _trimmed(batch.labels, dims, rows), _trimmed(batch.label_present, dims, rows)
    assert labels is not None and label_present is not None  # a Batch always carries both
    return Batch(nodes, labels, label_present)


def output_node(name: str, schema: ModelSchema) -> str | None:
    """The node whose row dims an output carries after the batch dim (None: no row dims)."""
    if name == "prediction":
        return schema.target.node
    head, _, arg = name.partition(":")
    if head == "leaf":
        return arg
    if head == "branch_embedding":
        return schema.path(arg)[-2].name
    return None


def pad_back(x: torch.Tensor, schema: ModelSchema, node: str | None) -> torch.Tensor:
    """Zero-pad the row dims of a trimmed tensor back to the node's reserved shape."""
    if node is None:
        return x
    reserved = schema.reserved_shape(node)
    have = tuple(x.shape[1 : 1 + len(reserved)])
    if have == reserved:
        return x
    out = x.new_zeros((x.shape[0], *reserved, *x.shape[1 + len(reserved) :]))
    out[(slice(None), *(slice(0, d) for d in have))] = x
    return out


def pad_batch_back(batch: Batch, schema: ModelSchema) -> Batch:
    """A trimmed batch at the reserved shape again (absent rows are zeros / False)."""
    nodes = {}
    for node in schema.root.walk():
        t = batch.nodes[node.name]
        padded: dict[str, Any] = {
            f.name: None if getattr(t, f.name) is None else pad_back(getattr(t, f.name), schema, node.name)
            for f in fields(NodeTensors)
        }
        nodes[node.name] = replace(t, **padded)
    target = schema.target.node
    return Batch(nodes, pad_back(batch.labels, schema, target), pad_back(batch.label_present, schema, target))


def restore_order(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows were produced in ``rows`` order; put row ``rows[i]`` back at position ``rows[i]``."""
    out = torch.empty_like(x)
    out[rows] = x
    return out
