"""Model-side schema: the tree of nodes the model is built from.

The harness turns a user's benchmark spec (tables, keys, paths) into this small, frozen
description; the model never sees table names or files. A node is the root (one row per
example) or a repeated branch (``max_length`` reserved rows per parent row). Nested
branches multiply reserved rows: a branch at depth d has shape ``[B, L1, ..., Ld]``.

Columns are ordered: continuous columns (``numeric`` and ``timestamp``, both encoded as one
standardised float) come first in ``node.continuous``, categorical columns in
``node.categorical``, then text columns in ``node.text`` (one vector per cell, computed by
the application's encoder outside the model). Category index 0 is null, 1 is "unknown" (unseen at fit time), real
values start at 2, so ``cardinality`` counts those two reserved slots.

The target column lives in exactly one node. Its cells are *learned-mask coordinates*:
present inputs whose value is always replaced by a learned mask vector, so the label never
leaks in; the model predicts each of them (one per root row for a root target, one per
present branch row for a leaf target).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

ColumnKind = Literal["numeric", "category", "timestamp", "text"]
TargetKind = Literal["category", "binary", "regression"]
Reduce = Literal["mean", "attention"]

NULL_INDEX = 0
UNKNOWN_INDEX = 1
RESERVED_CATEGORY_SLOTS = 2


@dataclass(frozen=True)
class ColumnDef:
    name: str
    kind: ColumnKind
    cardinality: int = 0  # category only: vocabulary size + the null and unknown slots
    width: int = 0  # text only: width of the vectors the application's encoder gives each cell


@dataclass(frozen=True)
class NodeDef:
    name: str
    columns: tuple[ColumnDef, ...]
    max_length: int = 1  # reserved rows per parent row; 1 for the root
    reduce: Reduce = "mean"  # how this branch reaches its parent (unused for the root)
    children: tuple[NodeDef, ...] = ()

    @property
    def continuous(self) -> tuple[ColumnDef, ...]:
        return tuple(c for c in self.columns if c.kind in ("numeric", "timestamp"))

    @property
    def categorical(self) -> tuple[ColumnDef, ...]:
        return tuple(c for c in self.columns if c.kind == "category")

    @property
    def text(self) -> tuple[ColumnDef, ...]:
        return tuple(c for c in self.columns if c.kind == "text")

    def walk(self) -> list[NodeDef]:
        """This node and all descendants, parents before children (pre-order)."""
        out = [self]
        for child in self.children:
            out.extend(child.walk())
        return out


@dataclass(frozen=True)
class TargetDef:
    node: str  # name of the root or branch node that holds the target column
    column: str
    kind: TargetKind
    num_classes: int = 1  # category: number of label classes; binary/regression: 1


@dataclass(frozen=True)
class ModelSchema:
    root: NodeDef
    target: TargetDef
    nodes: dict[str, NodeDef] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        nodes = {n.name: n for n in self.root.walk()}
        if len(nodes) != len(self.root.walk()):
            raise ValueError("node names must be unique across the schema tree")
        if self.target.node not in nodes:
            raise ValueError(f"target node {self.target.node!r} is not in the schema")
        object.__setattr__(self, "nodes", nodes)

    def depth(self, name: str) -> int:
        """Number of branch levels between the root and ``name`` (root = 0)."""
        return len(self.path(name)) - 1

    def path(self, name: str) -> list[NodeDef]:
        """Nodes from the root down to ``name``, both included."""

        def search(node: NodeDef, trail: list[NodeDef]) -> list[NodeDef] | None:
            trail = [*trail, node]
            if node.name == name:
                return trail
            for child in node.children:
                found = search(child, trail)
                if found:
                    return found
            return None

        found = search(self.root, [])
        if found is None:
            raise KeyError(name)
        return found

    def reserved_shape(self, name: str) -> tuple[int, ...]:
        """Reserved dims after the batch dim: () for the root, (L1, ..., Ld) for a branch."""
        return tuple(n.max_length for n in self.path(name)[1:])
