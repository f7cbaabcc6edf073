"""A request's prepared tensors are the offline chunk's rows for the same keys (issue 21: the
single-request speed-ups must not change what is served), read from Parquet and from DuckDB,
with ties in ``order_by`` under every overflow rule: tied children keep the order they were
read in, in a chunk as in a request (the lazy plan once reordered them in a chunk, by the
Polars thread count).

Named ``test_chain_request_prepare.py`` (tests/README.md): test_chain.py holds the chain's own
tests; this file is one aspect (a request's prepared tensors)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from model.batch import Batch
from tasks.run.chain import Chain
from tasks.sources import databases
from tasks.sources.files import resolve_sources
from tasks.spec import parse_spec
from tasks.stages.preprocess import preprocess
from tasks.stages.retrieve import list_root_keys, retrieve

PARENTS, CHILDREN, MAX_LENGTH = 600, 5, 2


@pytest.fixture(autouse=True)
def _close_connections():
    yield
    databases.close_all()


def _tables(seed: int = 0) -> dict[str, pa.Table]:
    """Parents with 0..CHILDREN children each, rows shuffled, ranks drawn from {0, 1}: most
    parents have tied children, and more than MAX_LENGTH of them."""
    rng = np.random.default_rng(seed)
    ids = np.arange(1, PARENTS + 1, dtype=np.int64)
    per = rng.integers(0, CHILDREN + 1, PARENTS)
    kid_parent = np.repeat(ids, per)
    order = rng.permutation(len(kid_parent))
    kids = pa.table(
        {
            "k_id": pa.array(np.arange(len(kid_parent), dtype=np.int64)[order]),
            "k_parent": pa.array(kid_parent[order]),
            "k_rank": pa.array(rng.integers(0, 2, len(kid_parent)).astype(np.int64)),
            "k_val": pa.array(rng.normal(size=len(kid_parent))),
            "k_tag": pa.array(rng.choice(["a", "b", "c"], len(kid_parent))),
        }
    )
    parents = pa.table(
        {
            "p_id": pa.array(ids[rng.permutation(PARENTS)]),
            "p_x": pa.array(rng.normal(size=PARENTS)),
            "p_label": pa.array(rng.choice(["yes", "no"], PARENTS)),
        }
    )
    return {"parents": parents, "kids": kids}


def _spec(overflow: str, database: str | None) -> dict[str, Any]:
    source: dict[str, Any] = {"tables": {"parents": "parents.parquet", "kids": "kids.parquet"}}
    if database is not None:
        source = {"database": {"url": database}}
    return {
        "name": "ties",
        "source": source,
        "schema": {
            "root": {"table": "parents", "key": "p_id", "columns": {"p_x": "numeric"}},
            "branches": [
                {
                    "name": "kids",
                    "table": "kids",
                    "parent_key": "k_parent",
                    "order_by": {"column": "k_rank"},
                    "max_length": MAX_LENGTH,
                    "overflow": overflow,
                    "columns": {"k_val": "numeric", "k_tag": "category"},
                }
            ],
        },
        "task": {"target": "p_label", "kind": "category"},
        "model": {"d_model": 8, "layers": 1, "heads": 2},
        "run": {"batch_size": 64, "epochs": 1, "warmup_batches": 0, "device": "cpu"},
    }


def _sources(tmp_path: Path, overflow: str, source: str):
    for name, table in _tables().items():
        pq.write_table(table, tmp_path / f"{name}.parquet")
    if source == "parquet":
        spec = parse_spec(_spec(overflow, None))
        return spec, resolve_sources(spec, tmp_path)
    databases.build_duckdb(tmp_path, tmp_path / "ties.duckdb", {"parents": ("p_id",), "kids": ("k_parent",)})
    spec = parse_spec(_spec(overflow, "duckdb:ties.duckdb"))
    return spec, databases.resolve_database(spec, tmp_path, None)


def _assert_rows_equal(request: Batch, chunk: Batch) -> None:
    torch.testing.assert_close(request.labels, chunk.labels, rtol=0, atol=0)
    torch.testing.assert_close(request.label_present, chunk.label_present, rtol=0, atol=0)
    assert request.nodes.keys() == chunk.nodes.keys()
    for name, node in request.nodes.items():
        for field in ("present", "continuous", "continuous_null", "categorical"):
            torch.testing.assert_close(
                getattr(node, field), getattr(chunk.nodes[name], field), rtol=0, atol=0, msg=f"{name}.{field}"
            )


@pytest.mark.parametrize("source", ["parquet", "duckdb"])
@pytest.mark.parametrize("overflow", ["keep_first", "keep_last", "sample"])
def test_request_tensors_are_the_chunk_rows_for_the_same_keys(tmp_path, overflow, source):
    spec, sources = _sources(tmp_path, overflow, source)
    chain = Chain(spec, sources, torch.device("cpu"))
    keys, _ = list_root_keys(spec, sources)
    chunk = chain.prepare_untimed(keys)  # fits the encoding on the chunk, as a run does
    assert chunk.batch is not None
    rng = np.random.default_rng(1)
    # one root (single_stream), a server batch, the DuckDB IN-list limit and past it, a key
    # asked for twice, and past LOOKUP_KEYS (the chunk-sized query)
    for n in (1, 1, 1, 3, 4, 5, 8, databases.LOOKUP_KEYS + 1):
        wanted = np.unique(rng.choice(keys, n, replace=False))
        request = chain.prepare_untimed(np.concatenate([wanted, wanted[:1]]) if n == 4 else wanted)
        assert request.batch is not None
        assert np.array_equal(request.keys.to_numpy(), wanted)
        rows = torch.from_numpy(np.searchsorted(keys, wanted))
        _assert_rows_equal(request.batch, chunk.batch.select(rows))
        assert torch.equal(request.is_train, chunk.is_train[rows])


def test_tied_children_keep_the_order_they_were_read_in(tmp_path):
    """keep_first over tied ranks keeps, per parent, the first MAX_LENGTH children of the rows
    as read ordered stably by rank: the chunk's answer is the request's and a plain stable
    sort's (numpy's, written out here), whatever the Polars thread count."""
    spec, sources = _sources(tmp_path, "keep_first", "parquet")
    keys, _ = list_root_keys(spec, sources)
    kids = _tables()["kids"]
    parent, rank, kid = (kids[c].to_numpy() for c in ("k_parent", "k_rank", "k_id"))
    order = np.lexsort((rank, parent))  # stable: ties keep file order
    want: dict[int, list[int]] = {}
    for p, k in zip(parent[order].tolist(), kid[order].tolist(), strict=True):
        if len(want.setdefault(p, [])) < MAX_LENGTH:
            want[p].append(k)
    # k_id is not an input column: read it through k_val, which is unique per child
    val_of = dict(zip(kids["k_val"].to_pylist(), kid.tolist(), strict=True))

    def kept(pre_table: pa.Table) -> dict[int, list[int]]:
        lists = pre_table["kids"].to_pylist()
        return {
            int(p): [val_of[c["k_val"]] for c in (cs or [])]
            for p, cs in zip(pre_table["p_id"].to_pylist(), lists, strict=True)
            if cs
        }

    chunk = kept(preprocess(spec, retrieve(spec, sources, keys)).table)
    assert chunk == want
    for k in keys[:: PARENTS // 20]:
        expected = {int(k): want[int(k)]} if int(k) in want else {}
        assert kept(preprocess(spec, retrieve(spec, sources, np.array([k]))).table) == expected
