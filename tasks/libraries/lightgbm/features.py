"""The nested row flattened into aggregates: one row of features per root row, LightGBM's input.

RelBench's and RelArena's LightGBM baseline reads a table, not a tree: each branch becomes
aggregates over its rows. From the harness's preprocessed table (one row per root key, each
branch a ``list<struct>`` column, nested to any depth):

- a root column: ``numeric`` as it is; ``timestamp`` in days (before the seed time on a
  time-anchored root, else since 1970-01-01); ``category`` its code among the training rows'
  ``MAX_VALUES`` most frequent values (a LightGBM categorical feature; another value or null is
  missing). The target, the key, the entity and the seed time are never features.
- a branch (a nested branch's rows pooled under their root row): ``<branch>.count``; for each
  ``numeric`` or ``timestamp`` column (timestamps in days as above) ``.mean``, ``.min``, ``.max``
  and ``.last`` (the row last in time by the branch's ``time`` column, else last in the branch's
  order; its value, null included); for each ``category`` column a count per value among the
  training rows' ``MAX_VALUES`` most frequent (``<branch>.<column>=<value>``) and one for every
  other value (``=__other``; nulls in neither). A root row without rows in the branch: count 0,
  category counts 0, the other aggregates missing.
- missing is NaN, LightGBM's missing value; a ``text`` column is refused (checks.py).

As of the seed time: the harness's preprocess already leaves out every branch row whose time is
after the root row's seed time, or null (tasks/stages/asof.py), and these features read only its
table. Where a branch's ``time`` column is one of its columns (the RelBench specs' are) the rows
are cut here again by the same rule, so a table that did not come through preprocess cannot
leak either; the tests check both.

Whole columns at a time (Polars explode, filter, group_by over every root row of the chunk);
the only Python loops are over branches, columns and vocabulary values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from tasks.spec import Branch, Spec

__all__ = ["MAX_VALUES", "OTHER", "Flattening", "branch_rows", "fit", "flatten"]

MAX_VALUES = 32  # category values kept per column: the training rows' most frequent
OTHER = "__other"  # the count of every other (known, non-null) value of a branch's category column
TRAIN_COLUMN = "__train"  # tasks/stages/split.py's TRAIN (not imported: checks.py stays light)
_ROW, _SEED = "__lgb_row", "__lgb_seed"  # the root row index and seed time carried down the branches
_US_PER_DAY = 86_400_000_000


@dataclass(frozen=True)
class Flattening:
    """The features of a spec's rows: fitted once (``fit``) on the first chunk's training rows,
    saved with the model, so every chunk and request gets the same columns."""

    names: tuple[str, ...]  # one per feature column, in order
    categorical: tuple[int, ...]  # features LightGBM reads as categories (root category codes)
    vocab: dict[str, tuple[str, ...]]  # "<node>.<column>" -> its kept values (a code is the index)

    def to_json(self) -> str:
        return json.dumps({"names": self.names, "categorical": self.categorical, "vocab": self.vocab})

    @staticmethod
    def from_json(text: str) -> Flattening:
        d = json.loads(text)
        return Flattening(tuple(d["names"]), tuple(d["categorical"]), {k: tuple(v) for k, v in d["vocab"].items()})


def _root_frame(spec: Spec, table: pa.Table) -> pl.DataFrame:
    """The table with the root row index (and the seed time) beside its columns."""
    frame = pl.DataFrame(pl.from_arrow(table))
    extra = [pl.int_range(pl.len(), dtype=pl.Int64).alias(_ROW)]
    seed = spec.schema_.root.seed_time
    if seed is not None:
        extra.append(_micros(pl.col(seed)).alias(_SEED))
    return frame.with_columns(extra)


def _micros(e: pl.Expr) -> pl.Expr:
    """A date or timestamp as microseconds since 1970-01-01 (Int64)."""
    return e.dt.epoch("us")


def branch_rows(spec: Spec, table: pa.Table) -> dict[str, pl.DataFrame]:
    """Each branch's rows, flat, with the root row they hang under (``__lgb_row``): a nested
    branch's rows under every kept parent row of that root row. Time-anchored: only rows whose
    ``time`` is at or before their root row's seed time (where that column is in the rows)."""
    frames: dict[str | None, pl.DataFrame] = {None: _root_frame(spec, table)}
    carried = [_ROW] + ([_SEED] if spec.schema_.as_of else [])
    for b, parent in spec.schema_.walk():
        rows = (
            frames[parent]
            .select(*carried, b.name)
            .explode(b.name)
            .filter(pl.col(b.name).is_not_null())  # an empty or null list explodes to one null row
            .unnest(b.name)
        )
        if spec.schema_.as_of and b.time is not None and b.time in rows.columns:
            t = _micros(pl.col(b.time))
            rows = rows.filter(t.is_not_null() & (t <= pl.col(_SEED)))
        frames[b.name] = rows
    return {name: f for name, f in frames.items() if name is not None}


def _days(spec: Spec, column: str) -> pl.Expr:
    """A timestamp column in days: before the seed time when the root has one, else since 1970."""
    t = _micros(pl.col(column)).cast(pl.Float64)
    if spec.schema_.as_of:
        return (pl.col(_SEED).cast(pl.Float64) - t) / _US_PER_DAY
    return t / _US_PER_DAY


def _value(spec: Spec, column: str, kind: str) -> pl.Expr:
    return _days(spec, column) if kind == "timestamp" else pl.col(column).cast(pl.Float64)


def _strings(column: str) -> pl.Expr:
    return pl.col(column).cast(pl.String)


def _root_columns(spec: Spec) -> dict[str, str]:
    root = spec.schema_.root
    skip = {spec.task.target, root.key, root.entity, root.seed_time}
    return {c: kind for c, kind in root.columns.items() if c not in skip}


def _top_values(values: pl.Series) -> tuple[str, ...]:
    """The ``MAX_VALUES`` most frequent non-null values (ties: by value), most frequent first."""
    counts = values.drop_nulls().value_counts(name="__n")
    top = counts.sort(["__n", values.name], descending=[True, False]).head(MAX_VALUES)
    return tuple(str(v) for v in top[values.name].to_list())


def fit(spec: Spec, table: pa.Table) -> Flattening:
    """The features of ``spec``: category vocabularies from ``table``'s training rows."""
    train = pl.Series(table[TRAIN_COLUMN].combine_chunks()).fill_null(False)
    names: list[str] = []
    categorical: list[int] = []
    vocab: dict[str, tuple[str, ...]] = {}
    root = pl.DataFrame(pl.from_arrow(table))
    for column, kind in _root_columns(spec).items():
        if kind == "category":
            vocab[f"root.{column}"] = _top_values(root.select(_strings(column)).filter(train).to_series())
            categorical.append(len(names))
        names.append(column)
    frames = branch_rows(spec, table)
    train_rows = pl.DataFrame({_ROW: np.flatnonzero(train.to_numpy()).astype(np.int64)})
    for b, _ in spec.schema_.walk():
        names.append(f"{b.name}.count")
        rows = frames[b.name].join(train_rows, on=_ROW, how="semi")
        for column, kind in b.columns.items():
            if kind in ("numeric", "timestamp"):
                names += [f"{b.name}.{column}.{agg}" for agg in ("mean", "min", "max", "last")]
            elif kind == "category":
                values = _top_values(rows.select(_strings(column)).to_series())
                vocab[f"{b.name}.{column}"] = values
                names += [f"{b.name}.{column}={v}" for v in (*values, OTHER)]
    return Flattening(tuple(names), tuple(categorical), vocab)


def _branch_aggregates(spec: Spec, b: Branch, rows: pl.DataFrame, fl: Flattening) -> list[pl.Expr]:
    exprs = [pl.len().cast(pl.Float64).alias(f"{b.name}.count")]
    for column, kind in b.columns.items():
        if kind in ("numeric", "timestamp"):
            x = _value(spec, column, kind)
            last = x.sort_by(_micros(pl.col(b.time)), maintain_order=True) if b.time in rows.columns else x
            exprs += [
                x.mean().alias(f"{b.name}.{column}.mean"),
                x.min().alias(f"{b.name}.{column}.min"),
                x.max().alias(f"{b.name}.{column}.max"),
                last.last().alias(f"{b.name}.{column}.last"),
            ]
        elif kind == "category":
            values = fl.vocab[f"{b.name}.{column}"]
            s = _strings(column)
            exprs += [(s == v).sum().cast(pl.Float64).alias(f"{b.name}.{column}={v}") for v in values]
            other = s.is_not_null() & ~s.is_in(list(values))
            exprs.append(other.sum().cast(pl.Float64).alias(f"{b.name}.{column}={OTHER}"))
    return exprs


def _counts(b: Branch, fl: Flattening) -> list[str]:
    """A branch's count features: its row count and each category value's."""
    out = [f"{b.name}.count"]
    for column, kind in b.columns.items():
        if kind == "category":
            out += [f"{b.name}.{column}={v}" for v in (*fl.vocab[f"{b.name}.{column}"], OTHER)]
    return out


def flatten(spec: Spec, table: pa.Table, fl: Flattening) -> np.ndarray:
    """``[rows, features]`` float64, the columns of ``fl.names``; NaN where missing."""
    n = table.num_rows
    root = _root_frame(spec, table)
    cols: list[pl.Expr] = []
    for column, kind in _root_columns(spec).items():
        if kind == "category":
            values = fl.vocab[f"root.{column}"]
            code = _strings(column).replace_strict(list(values), list(range(len(values))), default=None)
            cols.append(code.cast(pl.Float64).alias(column))
        else:
            cols.append(_value(spec, column, kind).alias(column))
    out = [root.select(_ROW, *cols)]
    frames = branch_rows(spec, table)
    index = root.select(_ROW)
    for b, _ in spec.schema_.walk():
        rows = frames[b.name]
        agg = rows.group_by(_ROW).agg(_branch_aggregates(spec, b, rows, fl))
        joined = index.join(agg, on=_ROW, how="left", maintain_order="left").drop(_ROW)
        out.append(joined.with_columns(pl.col(_counts(b, fl)).fill_null(0.0)))  # no rows: 0 of each
    features = pl.concat(out, how="horizontal").drop(_ROW)
    if features.columns != list(fl.names):
        raise RuntimeError(f"flattened columns {features.columns} are not the fitted {list(fl.names)}")
    if n == 0:
        return np.zeros((0, len(fl.names)))
    return features.cast(pl.Float64).to_numpy().astype(np.float64, copy=False)
