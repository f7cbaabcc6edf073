"""Length bucketing off vs on: compute time, materialised coordinates and quality, one process.

What: the predict compute of two workloads with `run.bucketing: off` (every batch padded to
the schema's reserved shape, key order) and `by_length` (roots grouped by present cells, each
batch padded to its own longest context per branch):
- `synthetic`: the seed note's example, one long context among short ones: roots with 2..10
  event rows (10..50 cells) and one root in 64 with 80 rows (400 cells), `max_length` 80;
- `tpch_customer`: customers with 0 to dozens of orders (16 kept) of 1..7 lines (8 reserved).
Why: the seed note says one 400-cell context in a batch of 50-cell contexts makes the whole
batch pay 400-cell prices. Goal: padded-path steady speedup >= 0.7 x the ratio of
materialised coordinates (off / on), quality within noise of `off`.
How: the real stages (retrieve, preprocess, tensorize) build each workload's chunk once; the
compute stage's `Engine` runs whole predict passes, off and on interleaved (order alternating
per round), the first round is warm-up, and the figure is the median over rounds of the sum
of per-batch step times (the model only, as `compute.steady_*`). Quality: the same model
trained with bucketing off and on (same seed, same epochs), accuracy on held-out roots.

    python benchmarks/bench_bucketing.py --scale 0.01 --rounds 5

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from model.arrow import Encoding
from model.schema import ModelSchema
from tasks.datasets.tpch import ensure_tpch
from tasks.libraries.reference.engine import Engine
from tasks.spec import Spec, load_spec, parse_spec
from tasks.stages.tensorize import Tensorized

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batches import prepared  # noqa: E402  (the harness's chain, untimed)

ROOT = Path(__file__).resolve().parent
DEVICE = torch.device("cpu")


def synthetic_tables(roots: int, seed: int = 0) -> dict[str, pa.Table]:
    """Short contexts (2..10 events) with one long one (80 events) in every 64 roots."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(2, 11, size=roots)
    counts[::64] = 80
    ctx = np.repeat(np.arange(roots), counts)
    value = rng.normal(size=ctx.size)
    label = np.bincount(ctx, weights=value, minlength=roots) > 0  # learnable from the events
    return {
        "contexts": pa.table({"ctx_id": np.arange(roots), "region": rng.choice(list("abcd"), roots), "label": label}),
        "events": pa.table(
            {
                "ev_ctx": ctx,
                "ev_pos": np.concatenate([np.arange(c) for c in counts]),
                "value": value,
                "amount": rng.gamma(2.0, size=ctx.size),
                "kind": rng.choice(list("xyz"), ctx.size),
                "flag": rng.choice(["p", "q"], ctx.size),
            }
        ),
    }


def synthetic_spec() -> dict:
    return {
        "name": "bucketing-synthetic",
        "source": {"tables": {"contexts": "contexts.parquet", "events": "events.parquet"}},
        "schema": {
            "root": {"table": "contexts", "key": "ctx_id", "columns": {"region": "category"}},
            "branches": [
                {
                    "name": "events",
                    "table": "events",
                    "parent_key": "ev_ctx",
                    "order_by": {"column": "ev_pos"},
                    "max_length": 80,
                    "reduce": "attention",
                    "columns": {
                        "value": "numeric",
                        "amount": "numeric",
                        "kind": "category",
                        "flag": "category",
                        "ev_pos": "numeric",
                    },
                }
            ],
        },
        "task": {"target": "label", "kind": "binary"},
        "model": {"d_model": 32, "layers": 2, "heads": 4},
        "run": {"batch_size": 64, "epochs": 3, "warmup_batches": 0, "device": "cpu"},
    }


def chunk(spec: Spec, folder: Path) -> tuple[Spec, Encoding, ModelSchema, Tensorized]:
    spec, schema, enc, tz = prepared(spec, folder)
    return spec, enc, schema, tz


def variant(spec: Spec, **run) -> Spec:
    d = copy.deepcopy(spec.to_dict())
    d["run"].update(run)
    return parse_spec(d)


def pass_seconds(engine: Engine, tz: Tensorized) -> float:
    """One predict pass; the sum of its per-batch model step times."""
    t = engine.predict_timings
    before = len(t.steady_seconds)
    engine.predict(tz, ("prediction",))
    return sum(t.steady_seconds[before:])


def measure(name: str, spec: Spec, enc, schema, tz: Tensorized, rounds: int, epochs: int) -> list[dict]:
    rows = []
    for packing in ("off", "auto"):
        engines = {
            b: Engine(variant(spec, bucketing=b, packing=packing, warmup_batches=0), schema, DEVICE, None, encoding=enc)
            for b in ("off", "by_length")
        }
        times: dict[str, list[float]] = {b: [] for b in engines}
        for r in range(rounds + 1):
            for b in ("off", "by_length") if r % 2 == 0 else ("by_length", "off"):
                engines[b].batch_coords.clear()
                s = pass_seconds(engines[b], tz)
                if r > 0:  # round 0 warms up both
                    times[b].append(s)
        coords = {b: sum(p for _, p in e.batch_coords) for b, e in engines.items()}
        occ = {b: [p / q for p, q in e.batch_coords] for b, e in engines.items()}
        off_s, on_s = statistics.median(times["off"]), statistics.median(times["by_length"])
        rows.append(
            {
                "workload": name,
                "path": "padded" if packing == "off" else "packed",
                "off_ms": off_s * 1e3,
                "on_ms": on_s * 1e3,
                "speedup": off_s / on_s,
                "coords_off": coords["off"],
                "coords_on": coords["by_length"],
                "coords_ratio": coords["off"] / coords["by_length"],
                "occupancy_p50_off": float(np.median(occ["off"])),
                "occupancy_p50_on": float(np.median(occ["by_length"])),
                "shapes_on": len(engines["by_length"].batch_shapes),
                "rows": tz.root_rows,
            }
        )
    quality = {}
    for b in ("off", "by_length"):
        engine = Engine(variant(spec, bucketing=b, epochs=epochs), schema, DEVICE, None, encoding=enc)
        for _ in range(epochs):
            engine.train(tz)
        engine.predict(tz, ("prediction",))
        quality[b] = engine.quality.metrics()
    for r in rows:
        r["quality_off"], r["quality_on"] = quality["off"], quality["by_length"]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.01, help="TPC-H scale for tpch_customer")
    ap.add_argument("--roots", type=int, default=2048, help="synthetic workload roots")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=3, help="training epochs for the quality check")
    ap.add_argument("--bucket-count", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave as is)")
    ap.add_argument("--workloads", default="synthetic,tpch_customer")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the chunk stays on CPU; batches move)")
    args = ap.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.workloads.split(","):
            if name == "synthetic":
                for t, table in synthetic_tables(args.roots).items():
                    pq.write_table(table, Path(tmp) / f"{t}.parquet")
                spec, folder = parse_spec(synthetic_spec()), Path(tmp)
            else:
                spec = load_spec(ROOT / f"{name}.yaml", [f"source.generate.tpch.scale={args.scale}"])
                folder, _ = ensure_tpch(args.scale)
            spec = variant(spec, bucket_count=args.bucket_count, device=args.device)
            spec, enc, schema, tz = chunk(spec, folder)
            rows += measure(name, spec, enc, schema, tz, args.rounds, args.epochs)
    print(
        f"predict compute per pass, median of {args.rounds} interleaved rounds; device {DEVICE}; "
        f"torch {torch.__version__}, threads {torch.get_num_threads()}; bucket_count {args.bucket_count}"
    )
    head = (
        f"{'workload':<14} {'path':<7} {'off ms':>9} {'on ms':>9} {'speedup':>8} {'coords off/on':>14} "
        f"{'goal':>6} {'occ p50 off/on':>15} {'shapes':>6}  quality off -> on"
    )
    print(head)
    for r in rows:
        goal = 0.7 * r["coords_ratio"]
        q = "accuracy" if "accuracy" in r["quality_off"] else "auc"
        print(
            f"{r['workload']:<14} {r['path']:<7} {r['off_ms']:>9.1f} {r['on_ms']:>9.1f} "
            f"{r['speedup']:>7.2f}x {r['coords_ratio']:>13.2f}x {goal:>5.2f}x "
            f"{r['occupancy_p50_off']:>7.3f}/{r['occupancy_p50_on']:.3f} {r['shapes_on']:>6}  "
            f"{q} {r['quality_off'].get(q, float('nan')):.4f} -> {r['quality_on'].get(q, float('nan')):.4f}"
        )
    padded = [r for r in rows if r["path"] == "padded"]
    print(
        json.dumps(
            {
                "bench": "bucketing",
                "rows": rows,
                "padded_goal_met": {r["workload"]: r["speedup"] >= 0.7 * r["coords_ratio"] for r in padded},
            }
        )
    )


if __name__ == "__main__":
    main()
