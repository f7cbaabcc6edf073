"""The input path against its baselines: columnar preprocess + tensorize vs row-wise pandas
and vs a plain memory copy of the bytes produced.

What: on one TPC-H chunk (the default workload's tables as retrieve hands them over), the
harness's preprocess (Polars) + tensorize (Arrow offsets -> padded tensors) against
(a) the row-wise code a user would first write: pandas ``groupby`` into a dict, then a Python
loop over parents that sorts, truncates and writes every cell of every child row, and
(b) ``memcpy`` of exactly as many bytes as the tensors produced (a floor no encoder beats).
Why: the input path must not leave the device idle; the row-wise version is what the
harness exists to replace. Goals: >= 20x the row-wise baseline; tensorize at >= 25% of
memcpy bandwidth on the same bytes.
How: the encoding (vocabularies, standardisation) is fitted once, outside every timing, and
both paths use it; the row-wise result is checked equal to the harness's tensors (same
work), then each path is timed --repeats times, interleaved, median reported.

    python benchmarks/bench_input_path.py [--scale 0.01] [--repeats 3]

Prints a table, then one JSON line. Branches one level deep only (the baseline is flat).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
from pathlib import Path

import numpy as np
import torch

from model.batch import Batch
from model.schema import NULL_INDEX, RESERVED_CATEGORY_SLOTS, UNKNOWN_INDEX
from tasks.measure.clock import Clock
from tasks.run.chain import Chain
from tasks.sources.open import open_sources
from tasks.spec import load_spec
from tasks.stages.preprocess import preprocess
from tasks.stages.retrieve import ROOT, list_root_keys, retrieve
from tasks.stages.tensorize import tensorize

ROOT_DIR = Path(__file__).resolve().parent
EPOCH = dt.date(1970, 1, 1)


def _cell(value, kind: str, key: str, enc) -> tuple[float, bool]:
    """One numeric/timestamp cell, standardised, and whether it is null."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return 0.0, True
    if kind == "timestamp":
        value = (
            (value - EPOCH).days
            if isinstance(value, dt.date) and not isinstance(value, dt.datetime)
            else value.timestamp() / 86_400.0
        )
    return (float(value) - enc.mean[key]) / enc.std[key], False


def rowwise(spec, retrieved, enc, schema) -> dict[str, np.ndarray]:
    """The row-wise pandas baseline: same outputs as ``encode``, one Python step per cell."""
    root = spec.schema_.root
    frames = {n: t.to_pandas() for n, t in retrieved.tables.items()}
    parents = frames[ROOT].drop_duplicates(root.key).sort_values(root.key)
    groups = {b.name: dict(tuple(frames[b.name].groupby(b.parent_key))) for b in spec.schema_.branches}
    vocab = {k: {v: i + RESERVED_CATEGORY_SLOTS for i, v in enumerate(vs)} for k, vs in enc.vocab.items()}
    classes = {v: i for i, v in enumerate(enc.classes)}
    B = len(parents)
    out: dict[str, np.ndarray] = {}
    for node in schema.root.walk():
        shape = (B, *schema.reserved_shape(node.name))
        out[f"{node.name}.present"] = np.zeros(shape, bool)
        out[f"{node.name}.cont"] = np.zeros((*shape, len(node.continuous)), np.float32)
        out[f"{node.name}.null"] = np.zeros((*shape, len(node.continuous)), bool)
        out[f"{node.name}.cat"] = np.zeros((*shape, len(node.categorical)), np.int64)
    labels = np.zeros(B, np.int64)
    nodes = {n.name: n for n in schema.root.walk()}

    def fill(node_name: str, at: tuple, row) -> None:
        node = nodes[node_name]
        out[f"{node_name}.present"][at] = True
        for j, c in enumerate(node.continuous):
            if node_name == schema.target.node and c.name == schema.target.column:
                continue
            v, null = _cell(row[c.name], c.kind, f"{node_name}.{c.name}", enc)
            out[f"{node_name}.cont"][at + (j,)] = v
            out[f"{node_name}.null"][at + (j,)] = null
        for j, c in enumerate(node.categorical):
            v = row[c.name]
            out[f"{node_name}.cat"][at + (j,)] = (
                NULL_INDEX if v is None else vocab[f"{node_name}.{c.name}"].get(str(v), UNKNOWN_INDEX)
            )

    for i, (_, prow) in enumerate(parents.iterrows()):
        fill(ROOT, (i,), prow)
        labels[i] = classes.get(str(prow[spec.task.target]), 0)
        for b in spec.schema_.branches:
            kids = groups[b.name].get(prow[root.key])
            if kids is None:
                continue
            if b.order_by is not None:
                kids = kids.sort_values(b.order_by.column, ascending=not b.order_by.descending, kind="stable")
            for slot, (_, krow) in enumerate(kids.head(b.max_length).iterrows()):
                fill(b.name, (i, slot), krow)
    out["labels"] = labels
    return out


def check_equal(base: dict[str, np.ndarray], batch: Batch) -> None:
    for name, t in batch.nodes.items():
        assert np.array_equal(base[f"{name}.present"], t.present.numpy()), name
        assert np.array_equal(base[f"{name}.cat"], t.categorical.numpy()), name
        assert np.array_equal(base[f"{name}.null"], t.continuous_null.numpy()), name
        np.testing.assert_allclose(base[f"{name}.cont"], t.continuous.numpy(), rtol=1e-5, atol=1e-5)
    assert np.array_equal(base["labels"], batch.labels.numpy().reshape(-1)), "labels"


def batch_bytes(batch: Batch) -> int:
    tensors = [batch.labels, batch.label_present]
    for t in batch.nodes.values():
        tensors += [t.present, t.continuous, t.continuous_null, t.categorical]
    return sum(x.numel() * x.element_size() for x in tensors)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=ROOT_DIR / "tpch_orders.yaml")
    ap.add_argument("--scale", type=float, default=0.01)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    spec = load_spec(args.spec, [f"source.generate.tpch.scale={args.scale}"])
    if any(b.branches for b in spec.schema_.branches):
        raise SystemExit("the row-wise baseline handles branches one level deep; pick such a spec")
    # The chain fits the encoding (untimed); the loop below times two of its stage functions
    # on one fixed retrieved table against the row-wise baseline and a memcpy.
    chain = Chain(spec, open_sources(spec, ROOT_DIR), torch.device("cpu"))
    keys, _ = list_root_keys(spec, chain.sources)
    chain.prepare_untimed(keys)
    enc, schema = chain.encoding, chain.schema
    retrieved = retrieve(spec, chain.sources, keys)
    clock = Clock("cpu")
    times: dict[str, list[float]] = {"preprocess": [], "tensorize": [], "rowwise": [], "memcpy": []}
    batch = tensorize(spec, preprocess(spec, retrieved), enc, schema).batch
    check_equal(rowwise(spec, retrieved, enc, schema), batch)
    nbytes = batch_bytes(batch)
    src, dst = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8), np.empty(nbytes, np.uint8)
    for r in range(args.repeats):
        steps = ["harness", "rowwise", "memcpy"]
        for step in steps if r % 2 == 0 else reversed(steps):
            if step == "harness":
                with clock.measure() as a:
                    pre = preprocess(spec, retrieved)
                with clock.measure() as b:
                    tensorize(spec, pre, enc, schema)
                times["preprocess"].append(a.seconds)
                times["tensorize"].append(b.seconds)
            elif step == "rowwise":
                with clock.measure() as a:
                    rowwise(spec, retrieved, enc, schema)
                times["rowwise"].append(a.seconds)
            else:
                best = math.inf
                for _ in range(5):
                    with clock.measure() as a:
                        np.copyto(dst, src)
                    best = min(best, a.seconds)
                times["memcpy"].append(best)
    med = {k: statistics.median(v) for k, v in times.items()}
    columnar = med["preprocess"] + med["tensorize"]
    speedup = med["rowwise"] / columnar
    bw_share = med["memcpy"] / med["tensorize"]
    rows = batch.size
    print(
        f"{spec.name} scale {args.scale:g}: {rows:,} root rows, {nbytes / 2**20:.1f} MiB of tensors, "
        f"{args.repeats} interleaved repeats, torch threads {torch.get_num_threads()}, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    print(f"{'path':<34} {'ms':>10} {'root rows/s':>12} {'GB/s':>7}")
    for name, sec in (
        ("preprocess (Polars)", med["preprocess"]),
        ("tensorize (Arrow -> tensors)", med["tensorize"]),
        ("preprocess + tensorize", columnar),
        ("row-wise pandas baseline", med["rowwise"]),
        ("memcpy of the same bytes", med["memcpy"]),
    ):
        gbs = f"{nbytes / sec / 1e9:>7.2f}" if "tensorize" in name or "memcpy" in name else f"{'':>7}"
        print(f"{name:<34} {sec * 1e3:>10.1f} {rows / sec:>12,.0f} {gbs}")
    print(
        f"columnar vs row-wise: {speedup:.1f}x (goal >= 20x); tensorize at {bw_share:.1%} of memcpy "
        f"bandwidth (goal >= 25%)"
    )
    print(
        json.dumps(
            {
                "bench": "input_path",
                "spec": spec.name,
                "scale": args.scale,
                "root_rows": rows,
                "tensor_bytes": nbytes,
                "median_seconds": med,
                "speedup_vs_rowwise": speedup,
                "tensorize_memcpy_bandwidth_share": bw_share,
                "goal_speedup_met": speedup >= 20,
                "goal_bandwidth_met": bw_share >= 0.25,
            }
        )
    )


if __name__ == "__main__":
    main()
