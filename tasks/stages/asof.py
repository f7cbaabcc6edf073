"""The as-of rule of preprocess: each time-anchored root row sees only rows at or before its seed time.

A root row of a time-anchored task is (entity, seed time) (``schema.root.entity``,
``schema.root.seed_time``); several rows share one entity. For each branch, top-down, the
branch's rows are joined to the parent *instances* they hang under (a root row, or a kept row of
the parent branch under one root row), and every row whose ``time`` column is after that root
row's seed time, or null, is dropped; only then are they ordered, numbered and cut by
``max_length`` / ``overflow`` (the same ``apply_overflow`` as every branch). A kept row is a new
instance (``__iid``) that its own nested rows hang under, carrying the seed time down, so a
nested row is filtered against its root row's seed time too, not its parent's.

Whole columns at a time, never a loop over entities or seed times. A branch with a time column
is cut by ranges (``_visible_by_ranges``): its rows sorted by (parent key, time), an instance's
visible rows are one contiguous run ending at a backward as-of join's match; with the derived
default (newest first, ``keep_first``) only the newest ``max_length`` of the run are gathered, so
the work follows the rows kept, not every row of an entity times its seed times. Other cuts gather
the whole run and apply the overflow rule as usual; a branch without ``time`` (a static table) is
joined whole for every seed time. Root rows stream in ``run.chunk_rows`` chunks: memory follows
one chunk, not every seed time.
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
# Branches with a time column are cut by ranges (``_visible_by_ranges``); False takes the plain
# join-then-filter path, which tests/tasks/stages/test_asof.py compares it with.
RANGES = True

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
        cut = b.model_copy(update={"parent_key": PID})
        if b.time is not None and FILTER and RANGES:
            newest = _newest_first(b)
            rows, visible = _visible_by_ranges(frame, left, b, seed_type, newest)
            if newest is None:
                rows, dropped[b.name] = overflow(rows, cut, spec.run.seed)
            else:  # already cut to the newest max_length: what keep_first would drop
                dropped[b.name] = visible - rows.height
        else:
            rows = frame.join(left, on=b.parent_key, how="inner", maintain_order="left")
            if b.time is not None and FILTER:  # null times are not known to be before the seed: dropped
                rows = rows.filter(_instant(b.time, frame.schema[b.time]) <= _instant(SEED, seed_type))
            rows, dropped[b.name] = overflow(rows, cut, spec.run.seed)
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


def _newest_first(b: Branch) -> int | None:
    """``max_length`` when the branch keeps its newest rows by its own time column (the derived
    default: ``order_by`` the time column descending, ``overflow: keep_first``), else None."""
    o = b.order_by
    if b.overflow == "keep_first" and o is not None and o.column == b.time and o.descending:
        return b.max_length
    return None


def _visible_by_ranges(
    frame: pl.DataFrame, left: pl.DataFrame, b: Branch, seed_type: pl.DataType, newest: int | None
) -> tuple[pl.DataFrame, int]:
    """The rows of ``frame`` each parent instance of ``left`` (``PID``, ``b.parent_key``, ``SEED``)
    sees, as ranges of the rows sorted by (parent key, time): an entity's rows up to a seed time
    are one contiguous run, found by one backward as-of join per (parent key, time), so the work
    follows the rows kept, not every row of the entity times its seed times. ``newest``: only the
    newest that many (already in ``keep_first`` order, newest first, ties in the order read).

    Returns (the rows with ``PID`` and ``SEED``, in the join path's order; rows visible before any
    ``newest`` cut)."""
    time, pos, read = "__t", "__pos", "__read"
    c = (
        frame.with_row_index(read)
        .with_columns(_instant(b.time or "", frame.schema[b.time or ""]).alias(time))
        .filter(pl.col(time).is_not_null())  # null times are not known to be before the seed: dropped
        .sort([b.parent_key, time, read], descending=[False, False, True])  # reversed below: ties as read
        .with_row_index(pos)
        .with_columns(pl.col(pos).cast(pl.Int64))  # signed: end - (newest - 1) may go below 0
    )
    ends = c.group_by([b.parent_key, time]).agg(pl.col(pos).max().alias("__end")).sort(time)
    starts = c.group_by(b.parent_key).agg(pl.col(pos).min().alias("__start"))
    inst = (
        left.with_columns(_instant(SEED, seed_type).alias(time))
        .sort(time)
        .join_asof(ends, on=time, by=b.parent_key, strategy="backward", check_sortedness=False)
        .filter(pl.col("__end").is_not_null())
        .join(starts, on=b.parent_key, how="left")
    )
    visible = int((inst["__end"] - inst["__start"] + 1).sum()) if inst.height else 0
    if newest is None:
        span = pl.int_ranges("__start", pl.col("__end") + 1, dtype=pl.Int64)
    else:  # newest first: from the end backwards, at most ``newest``
        low = pl.max_horizontal("__start", pl.col("__end") - (newest - 1))
        span = pl.int_ranges("__end", low - 1, step=-1, dtype=pl.Int64)
    picked = inst.select(PID, SEED, span.alias(pos)).explode(pos).drop_nulls(pos)
    rows = c.drop(time).select(pl.all().gather(picked[pos].cast(pl.UInt32)))
    rows = rows.drop(pos).with_columns(picked[PID], picked[SEED])
    # the join path's order: by parent instance, then (newest) the cut's order or (all) as read
    rows = rows.sort(PID, maintain_order=True) if newest is not None else rows.sort([PID, read])
    return rows.drop(read), visible


def _instant(column: str, dtype: pl.DataType) -> pl.Expr:
    """A date or datetime column as naive UTC microseconds, so any two compare: zoned times in
    UTC, dates at midnight, and values past the ns range (a 9999-12-31 placeholder) kept, not
    overflowed."""
    expr = pl.col(column)
    if isinstance(dtype, pl.Datetime) and dtype.time_zone is not None:
        expr = expr.dt.convert_time_zone("UTC").dt.replace_time_zone(None)
    return expr.cast(pl.Datetime("us"))
