"""The as-of rule of preprocess: each time-anchored root row sees only rows at or before its seed time.

A root row of a time-anchored task is (entity, seed time) (``schema.root.entity``,
``schema.root.seed_time``); several rows share one entity. For each branch, top-down, the
branch's rows are joined to the parent *instances* they hang under (a root row, or a kept row of
the parent branch under one root row), and every row whose ``time`` column is after that root
row's seed time, or null, is dropped; only then are they ordered, numbered and cut by
``max_length`` / ``overflow`` (the same ``apply_overflow`` as every branch). A kept row is a new
instance (``__iid``) that its own nested rows hang under, carrying the seed time down, so a
nested row is filtered against its root row's seed time too, not its parent's.

Whole columns at a time: one equi-join per branch on the parent key, then a vectorised
comparison with the carried seed time; no loop over entities or seed times. The join's size is
the rows of each entity times the chunk's seed times of that entity, which is why the workload
streams root rows in ``run.chunk_rows`` chunks: memory follows one chunk, not every seed time.
A branch without ``time`` (a static table) is kept whole for every seed time.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from tasks.spec import Branch, Spec

ROOT = "root"
IID, PID, SEED = "__iid", "__pid", "__seed"

# Test-only switch: tests/flows/test_relbench_leakage.py turns the filter off to show that its
# planted leak is caught (quality near perfect without the filter, at chance with it).
FILTER = True

Overflow = Callable[[pl.DataFrame, Branch, int], tuple[pl.DataFrame, int]]


def nest_as_of(
    spec: Spec, roots: pl.DataFrame, frames: dict[str, pl.DataFrame], overflow: Overflow
) -> tuple[pl.DataFrame, dict[str, int], dict[str, int]]:
    """One row per root row with each branch as a ``list<struct>`` column, as of the seed time.

    Returns (the nested frame, overflow-dropped rows per branch, kept rows per branch)."""
    root = spec.schema_.root
    assert root.seed_time is not None  # the caller takes this path only for time-anchored roots
    entity = root.entity or root.key
    seed_type = roots.schema[root.seed_time]
    # instances each branch's rows hang under: (instance id, the column its children join on, seed time)
    parents: dict[str, pl.DataFrame] = {
        ROOT: roots.select(pl.col(root.key).alias(IID), pl.col(entity), pl.col(root.seed_time).alias(SEED))
    }
    join_col = {ROOT: entity}
    kept: dict[str, pl.DataFrame] = {}
    dropped: dict[str, int] = {}
    child_rows: dict[str, int] = {}
    target_node = spec.task.branch or ROOT
    walk = spec.schema_.walk()
    for b, parent_name in walk:
        parent = parents[parent_name or ROOT]
        on = join_col[parent_name or ROOT]
        frame = frames[b.name]
        left = parent.select(
            pl.col(IID).alias(PID), pl.col(on).cast(frame.schema[b.parent_key]).alias(b.parent_key), pl.col(SEED)
        )
        rows = frame.join(left, on=b.parent_key, how="inner", maintain_order="left")
        if b.time is not None and FILTER:  # null times are not known to be before the seed: dropped
            rows = rows.filter(_instant(b.time, frame.schema[b.time]) <= _instant(SEED, seed_type))
        rows, dropped[b.name] = overflow(rows, b.model_copy(update={"parent_key": PID}), spec.run.seed)
        rows = rows.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias(IID))
        kept[b.name], child_rows[b.name] = rows, rows.height
        if b.branches:
            assert b.key is not None  # the spec requires a key on branches with branches
            parents[b.name] = rows.select(IID, b.key, SEED)
            join_col[b.name] = b.key

    nested: dict[str, pl.DataFrame] = {}
    for b, _ in reversed(walk):
        df = kept.pop(b.name)
        payload = [*b.columns]
        if target_node == b.name and spec.task.target not in payload:
            payload.append(spec.task.target)
        for child in b.branches:
            df = df.join(nested.pop(child.name), left_on=IID, right_on=PID, how="left", maintain_order="left")
            payload.append(child.name)
        nested[b.name] = df.group_by(PID, maintain_order=True).agg(pl.struct(payload).alias(b.name))

    out = roots
    for b in spec.schema_.branches:
        out = out.join(nested.pop(b.name), left_on=root.key, right_on=PID, how="left", maintain_order="left")
    return out, dropped, child_rows


def _instant(column: str, dtype: pl.DataType) -> pl.Expr:
    """A date or datetime column as naive UTC microseconds, so any two compare: zoned times in
    UTC, dates at midnight, and values past the ns range (a 9999-12-31 placeholder) kept, not
    overflowed."""
    expr = pl.col(column)
    if isinstance(dtype, pl.Datetime) and dtype.time_zone is not None:
        expr = expr.dt.convert_time_zone("UTC").dt.replace_time_zone(None)
    return expr.cast(pl.Datetime("us"))
