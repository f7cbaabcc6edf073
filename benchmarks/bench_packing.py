"""Packed vs padded encoder compute, side by side in one process.

What: the model's encoder work (all branch encoders + pools + head) on real TPC-H batches of
the `tpch_customer` workload (customer -> 16 orders -> 8 lines each), once with automatic
packing (present coordinates only, length-bucketed dense attention) and once padded +
masked (`packing: off`), forward (eval, no grad) and forward+backward (train, dropout 0).
Why: the model promises that padding and skipped coordinates are absent from attention and
that eligible work is packed automatically; the payoff should scale with 1 / occupancy.
How: the same batches, the two paths interleaved batch by batch (drift hits both alike),
warm-up batches dropped, medians over batches. Goal: forward speedup >= 0.7 / occupancy.

    python benchmarks/bench_packing.py --scale 0.1 --batch-size 64 --batches 20

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from model import ModelConfig, RelationalTransformer
from model.arrow import coordinate_counts
from tasks.measure.clock import Clock
from tasks.spec import load_spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batches import prepared  # noqa: E402  (the harness's chain, untimed)

ROOT = Path(__file__).resolve().parent


def load_batch(scale: float):
    spec = load_spec(ROOT / "tpch_customer.yaml", [f"source.generate.tpch.scale={scale}"])
    spec, schema, _, tz = prepared(spec, ROOT)
    return spec, schema, tz.batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave as is)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    spec, schema, batch = load_batch(args.scale)
    torch.manual_seed(0)
    model = RelationalTransformer(
        schema, ModelConfig(d_model=spec.model.d_model, layers=spec.model.layers, heads=spec.model.heads, dropout=0.0)
    )
    clock = Clock("cpu")
    order = torch.randperm(batch.size, generator=torch.Generator().manual_seed(0))
    parts = [batch.select(idx) for idx in order.split(args.batch_size)][: args.batches + args.warmup]
    present = reserved = 0
    for part in parts[args.warmup :]:
        p, r = coordinate_counts(part, schema)
        present, reserved = present + p, reserved + r
    occupancy = present / reserved
    times: dict[tuple[str, str], list[float]] = {}
    for mode in ("forward", "forward+backward"):
        for i, part in enumerate(parts):
            for packing in ("auto", "off") if i % 2 == 0 else ("off", "auto"):
                model.packing = packing
                if mode == "forward":
                    model.eval()
                    with torch.no_grad(), clock.measure() as span:
                        model(part, outputs=("prediction",))
                else:
                    model.train()
                    model.zero_grad(set_to_none=True)
                    with clock.measure() as span:
                        model.loss(part, model(part, outputs=("prediction",))).backward()
                path = model.last_encoder_path
                if i >= args.warmup:
                    times.setdefault((mode, packing), []).append(span.seconds)
                    assert (path == "padded") == (packing == "off"), (packing, path)
    rows = []
    for mode in ("forward", "forward+backward"):
        packed = statistics.median(times[(mode, "auto")])
        padded = statistics.median(times[(mode, "off")])
        rows.append({"mode": mode, "packed_ms": packed * 1e3, "padded_ms": padded * 1e3, "speedup": padded / packed})
    goal = 0.7 / occupancy
    print(
        f"tpch_customer scale {args.scale:g}: {len(parts) - args.warmup} batches of {args.batch_size} "
        f"customers, occupancy {occupancy:.3f} ({present:,} of {reserved:,} coordinates), "
        f"torch threads {torch.get_num_threads()}"
    )
    print(f"{'mode':<18} {'packed ms':>10} {'padded ms':>10} {'speedup':>8}  goal >= {goal:.2f}x (fwd)")
    for r in rows:
        print(f"{r['mode']:<18} {r['packed_ms']:>10.1f} {r['padded_ms']:>10.1f} {r['speedup']:>7.2f}x")
    print(
        json.dumps(
            {
                "bench": "packing",
                "scale": args.scale,
                "occupancy": occupancy,
                "goal_forward": goal,
                "rows": rows,
                "forward_goal_met": rows[0]["speedup"] >= goal,
            }
        )
    )


if __name__ == "__main__":
    main()
