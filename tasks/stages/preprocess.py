"""Stage 2, preprocess: flat source rows -> one nested row per root key.

Eager Polars steps per branch, top-down: keep only rows under surviving parent rows
(children of rows that an overflow rule dropped are structurally skipped, not counted as
overflow), order them, number them within their parent and apply the overflow rule against
``max_length``. Then bottom-up: each branch becomes a ``list<struct>`` column on its parent,
so the result has one row per root key with nested lists to any depth. A root row with no
children gets an empty (null) list: it still flows through.

The train/validation split is a stable hash of the root key (tasks/stages/split.py), so it
is the same in every chunk, run, mode and library version.

Eager, not a lazy plan: a request's few rows made planning and optimising a lazy query per
branch the bulk of its preprocess time (a one-root request: about 3x the eager steps), and a
chunk gains nothing from the optimiser here (every step is needed; the inputs are in memory).
The steps and their order are the same. One difference, on purpose: children whose
``order_by`` values tie keep the order they were read in (a stable sort of the rows as read).
The lazy plan let its semi join reorder rows, and how depended on the Polars thread count, so
which tied children ``max_length`` kept differed between a chunk and a request for the same key
(the output check's offline pass vs the served request), and between hosts. Casts of key
columns that already have the wanted type are skipped (a no-op cast is still a pass).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import polars as pl
import pyarrow as pa

from tasks.runtime.errors import UserError
from tasks.spec import Branch, Spec
from tasks.stages.asof import nest_as_of
from tasks.stages.retrieve import ROOT, Retrieved
from tasks.stages.split import FIT, SCORED, TRAIN, split_is_train, split_roles

__all__ = ["FIT", "SCORED", "TRAIN", "Preprocessed", "preprocess", "split_is_train"]


@dataclass
class Preprocessed:
    table: pa.Table  # one row per root key: key, root columns, branch lists, __train
    root_rows: int
    overflow_dropped: dict[str, int] = field(default_factory=dict)
    child_rows: dict[str, int] = field(default_factory=dict)  # kept rows per branch


def _apply_overflow(df: pl.DataFrame, b: Branch, seed: int) -> tuple[pl.DataFrame, int]:
    """Order children within their parent and keep at most ``max_length`` of them."""
    if b.order_by is not None:
        df = df.sort(
            [b.parent_key, b.order_by.column],
            descending=[False, b.order_by.descending],
            nulls_last=True,
            maintain_order=True,
        )
    else:
        df = df.sort(b.parent_key, maintain_order=True)
    if df.height <= b.max_length:  # no parent can have more: every rule keeps every row
        return df, 0
    n = pl.len().over(b.parent_key)
    pos = pl.int_range(pl.len()).over(b.parent_key)
    if b.overflow == "keep_first" or b.overflow == "error":
        keep = pos < b.max_length
    elif b.overflow == "keep_last":
        keep = pos + b.max_length >= n  # not n - max_length: pl.len() is unsigned
    else:  # sample: a seeded random subset, still in order
        keep = pl.int_range(pl.len()).shuffle(seed=seed).over(b.parent_key) < b.max_length
    df = df.with_columns(__keep=keep, __n=n)
    dropped = int(df.height - df["__keep"].sum())
    if dropped and b.overflow == "error":
        worst = df.filter(pl.col("__n") > b.max_length).sort("__n", descending=True).row(0, named=True)
        raise UserError(
            f"Branch '{b.name}' has overflow: error, but parent key {worst[b.parent_key]!r} has "
            f"{worst['__n']} rows in table '{b.table}' (max_length {b.max_length}). Raise "
            f"max_length to at least {worst['__n']}, or choose overflow keep_first, keep_last "
            "or sample."
        )
    return (df.filter("__keep").drop("__keep", "__n") if dropped else df.drop("__keep", "__n")), dropped


def _cast(df: pl.DataFrame, column: str, dtype: pl.DataType) -> pl.DataFrame:
    """``column`` as ``dtype``; the frame itself when it already is."""
    return df if df.schema[column] == dtype else df.with_columns(pl.col(column).cast(dtype))


def preprocess(spec: Spec, retrieved: Retrieved) -> Preprocessed:
    root = spec.schema_.root
    frames = {name: cast(pl.DataFrame, pl.from_arrow(t)) for name, t in retrieved.tables.items()}
    roots = frames[ROOT]  # one row (a one-root request) is already unique and sorted
    roots = roots if roots.height <= 1 else roots.unique(root.key, keep="first").sort(root.key)
    if spec.schema_.as_of:  # time-anchored rows: each sees only rows up to its seed time
        out, dropped, child_rows = nest_as_of(spec, roots, frames, _apply_overflow)
    else:
        out, dropped, child_rows = _nest(spec, roots, frames)
    del frames
    out = out.with_columns(split_roles(spec, out))
    return Preprocessed(table=out.to_arrow(), root_rows=out.height, overflow_dropped=dropped, child_rows=child_rows)


def _nest(
    spec: Spec, roots: pl.DataFrame, frames: dict[str, pl.DataFrame]
) -> tuple[pl.DataFrame, dict[str, int], dict[str, int]]:
    root = spec.schema_.root
    target_node = spec.task.branch or ROOT
    kept: dict[str, pl.DataFrame] = {ROOT: roots}
    dropped: dict[str, int] = {}

    # Loops over Schema.walk() (parents first), not recursive closures: those put the chunk's
    # frames (zero-copy views of retrieve's tables) in reference cycles, alive until the cyclic
    # garbage collector ran.
    walk = spec.schema_.walk()
    keys = {ROOT: root.key} | {b.name: b.key for b, _ in walk}
    for b, parent_name in walk:
        parent, parent_key = parent_name or ROOT, keys[parent_name or ROOT]
        assert parent_key is not None  # the spec requires a key on branches with branches
        frame = frames[b.name]
        parents = _cast(kept[parent].select(parent_key), parent_key, frame.schema[b.parent_key])
        # in the order read, so the stable sort below breaks ties by it (see the module doc)
        rows = frame.join(
            parents.rename({parent_key: b.parent_key}), on=b.parent_key, how="semi", maintain_order="left"
        )
        kept[b.name], dropped[b.name] = _apply_overflow(rows, b, spec.run.seed)

    # Each branch's rows as one list<struct> per parent key, children before parents.
    nested: dict[str, pl.DataFrame] = {}
    for b, _ in reversed(walk):
        df = kept[b.name]
        payload = [*b.columns]
        if target_node == b.name and spec.task.target not in payload:
            payload.append(spec.task.target)
        for child in b.branches:
            assert b.key is not None  # the spec requires a key on branches with branches
            agg = _cast(nested.pop(child.name), child.parent_key, df.schema[b.key])
            df = df.join(agg, left_on=b.key, right_on=child.parent_key, how="left", maintain_order="left")
            payload.append(child.name)
        nested[b.name] = df.group_by(b.parent_key, maintain_order=True).agg(pl.struct(payload).alias(b.name))

    out = kept[ROOT]
    for b in spec.schema_.branches:
        agg = _cast(nested.pop(b.name), b.parent_key, out.schema[root.key])
        out = out.join(agg, left_on=root.key, right_on=b.parent_key, how="left", maintain_order="left")
    return out, dropped, {name: df.height for name, df in kept.items() if name != ROOT}
