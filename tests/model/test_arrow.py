"""``model.arrow.encode`` bit for bit: digests of every tensor it makes, taken from the
per-column implementation before the tensorize speed-up (commit 8517157), so a faster encode
must give exactly the same bytes, dtypes and shapes.

The table is synthetic and seeded: two levels of nesting, empty and full branches, nulls in
every kind, unseen categories (the encoding is fitted on the first half), decimal, float,
int, date and timestamp columns, text vectors, a root and a branch target of each kind, the
reserved lengths, bucketed lengths and trimmed lengths.
"""

from __future__ import annotations

import hashlib
from dataclasses import fields
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest
import torch

from model.arrow import NodeLayout, encode, encode_trimmed, fit_encoding, model_schema
from model.batch import Batch
from model.schema import TargetDef

N = 3000


def _nulls(rng: np.random.Generator, n: int, share: float) -> np.ndarray:
    return rng.random(n) < share


def _table(dictionary: bool = False) -> pa.Table:
    """``dictionary``: the category columns (and the category target) dictionary-encoded, as
    retrieve reads Parquet text columns; ``kk`` keeps its nulls as a dictionary value."""
    rng = np.random.default_rng(7)

    def cat(arr: pa.Array, null_encoding: str = "mask") -> pa.Array:
        return arr.dictionary_encode(null_encoding) if dictionary else arr

    words = np.array(["red", "green", "blue", "cyan", "plum", "teal", "gold"])
    n_a = rng.integers(0, 5, N)  # 0..4 children (max_length 4: preprocess truncated already)
    m = int(n_a.sum())
    n_b = rng.integers(0, 4, m)  # 0..3 grandchildren (max_length 3)
    k = int(n_b.sum())
    b = pa.StructArray.from_arrays(
        [
            pa.array(rng.normal(5, 2, k), mask=_nulls(rng, k, 0.1)),
            cat(pa.array(words[rng.integers(0, 7, k)], pa.large_string(), mask=_nulls(rng, k, 0.05)), "encode"),
        ],
        names=["u", "kk"],
    )
    b_lists = pa.LargeListArray.from_arrays(np.concatenate([[0], np.cumsum(n_b)]).astype(np.int64), b)
    text = pa.FixedSizeListArray.from_arrays(pa.array(rng.normal(0, 1, m * 3).astype(np.float32)), 3)
    text = pa.array(text.to_pylist(), pa.list_(pa.float32(), 3), mask=_nulls(rng, m, 0.1))
    a = pa.StructArray.from_arrays(
        [
            pa.array(rng.integers(-50, 50, m), mask=_nulls(rng, m, 0.1)),
            cat(pa.array(words[rng.integers(0, 7, m)], pa.large_string(), mask=_nulls(rng, m, 0.1))),
            pa.array(rng.integers(8000, 12000, m).astype("int32"), pa.int32()).cast(pa.date32()),
            pa.array(rng.normal(0, 3, m), mask=_nulls(rng, m, 0.2)),  # the branch target
            text,
            b_lists,
        ],
        names=["v", "c", "t", "r", "e", "b"],
    )
    a_lists = pa.LargeListArray.from_arrays(np.concatenate([[0], np.cumsum(n_a)]).astype(np.int64), a)
    cents = rng.integers(0, 10**7, N)
    return pa.table(
        {
            "key": np.arange(N),
            "x": pa.array(rng.normal(0, 1, N), mask=_nulls(rng, N, 0.1)),
            "d": pa.array(
                [None if i % 17 == 0 else Decimal(int(c)).scaleb(-2) for i, c in enumerate(cents)],
                pa.decimal128(15, 2),
            ),
            "cat": cat(pa.array(words[rng.integers(0, 7, N)], pa.large_string(), mask=_nulls(rng, N, 0.1))),
            "ts": pa.array(rng.integers(0, 10**15, N), pa.timestamp("us")),
            "y": cat(pa.array(np.array(["F", "O", "P"])[rng.integers(0, 3, N)], mask=_nulls(rng, N, 0.05))),
            "flag": pa.array(rng.random(N) < 0.4, mask=_nulls(rng, N, 0.05)),
            "a": a_lists,
        }
    )


def _layout(target: str) -> NodeLayout:
    b = NodeLayout("b", {"u": "numeric", "kk": "category"}, 3, "mean")
    a_cols = {"v": "numeric", "c": "category", "t": "timestamp", "e": "text"}
    if target == "r":
        a_cols["r"] = "numeric"
    root = {"x": "numeric", "d": "numeric", "cat": "category", "ts": "timestamp"}
    if target != "r":
        root[target] = "numeric"
    return NodeLayout("root", root, 1, "mean", (NodeLayout("a", a_cols, 4, "attention", (b,)),))


def _digest(batch: Batch) -> str:
    h = hashlib.sha256()
    tensors: list[tuple[str, torch.Tensor | None]] = [("labels", batch.labels), ("label_present", batch.label_present)]
    for name, node in batch.nodes.items():
        tensors += [(f"{name}.{f.name}", getattr(node, f.name)) for f in fields(node)]
    for name, t in tensors:
        h.update(name.encode())
        if t is not None:
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()[:20]


CASES = {
    # (target column, kind, node): digests at reserved and two trimmed lengths, and of two childless roots
    ("y", "category", "root"): (
        "7f6e3f79b594a5f00883",
        "3686bcd8da346276ebbf",
        "1f9cd131cafa3ffdebd4",
        "6f7751275877c3dfd4e5",
    ),
    ("flag", "binary", "root"): (
        "e42ca982a5fed8100c68",
        "2051b93633126054081d",
        "25a8bab4f9f8b778ac00",
        "dc77d2fbd95a916805fb",
    ),
    ("r", "regression", "a"): (
        "0e03306673bc8487ee42",
        "7075f81c5c70b36cd826",
        "ac64eca762829964ff4a",
        "99012303cd9a88cbbe6c",
    ),
}


@pytest.mark.parametrize("dictionary", [False, True], ids=["plain", "dictionary"])
@pytest.mark.parametrize("case", list(CASES), ids=lambda c: c[1])
def test_encode_gives_the_same_bytes_as_before(case, dictionary):
    """Dictionary-encoded category columns give the same bytes: each distinct value mapped
    once and gathered (the whole table), or decoded first where a slice holds fewer cells than
    the dictionary has values (the 5- and 2-row slices)."""
    column, kind, node = case
    table = _table(dictionary)
    lay = _layout(column)
    target = TargetDef(node, column, kind)
    enc = fit_encoding(table.slice(0, N // 2), lay, target)  # the second half holds unseen values
    schema = model_schema(lay, target, enc)
    got = (
        _digest(encode(table, schema, lay, enc)),
        _digest(encode_trimmed(table.slice(0, 200), schema, lay, enc)),
        _digest(encode_trimmed(table.slice(27, 5), schema, lay, enc)),  # a: 2 of 4 slots
        _digest(encode(table.slice(46, 2), schema, lay, enc)),  # no branch rows at all
    )
    assert got == CASES[case]
