"""Text encoding: encoder throughput (cells/s) and its share next to compute, one process.

What: (1) the default `hashed` encoder over TPC-H's comment columns (`o_comment`,
`l_comment`) in cells/s and MB/s at two widths; (2) for the text workloads
(`tpch_orders_text`, `tpch_orders_text_short`), the predict path's stages run in-process
(retrieve, preprocess, encode, tensorize, compute, no write) with the encode and compute
seconds side by side.
Why: the seed note says model-only timing hides the dominant cost for small contexts, "where
text encoding often takes longer than the forward pass"; the encode step is the
application's and is timed on its own.
How: each figure is the median of `--rounds` repeats after one warm-up; untrained weights
(a speed run: quality is not the point here). The flow's stage table (`relflow-bench run
benchmarks/tpch_orders_text.yaml`) gives the same split with Prefect and MLflow around it.

    python benchmarks/bench_text.py --scale 0.01 --rounds 3

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import pyarrow.parquet as pq
import torch

from tasks.datasets.tpch import ensure_tpch
from tasks.measure.clock import Clock
from tasks.run.chain import Chain
from tasks.sources.open import open_sources
from tasks.spec import load_spec
from tasks.stages.encode import load_encoder
from tasks.stages.retrieve import list_root_keys

ROOT = Path(__file__).resolve().parent


def median_seconds(fn, rounds: int, clock: Clock) -> float:
    fn()  # warm-up
    times = []
    for _ in range(rounds):
        with clock.measure() as span:
            fn()
        times.append(span.seconds)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.01)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    clock = Clock(torch.device(args.device))
    folder, _ = ensure_tpch(args.scale)
    encoder_rows = []
    for table, column in (("orders", "o_comment"), ("lineitem", "l_comment")):
        cells = pq.read_table(folder / f"{table}.parquet", columns=[column])[column].combine_chunks()
        nbytes = cells.nbytes
        for dim in (64, 256):
            fn = load_encoder("hashed", dim)
            s = median_seconds(lambda fn=fn, cells=cells: fn(cells), args.rounds, clock)
            encoder_rows.append(
                {
                    "column": column,
                    "dim": dim,
                    "cells": len(cells),
                    "seconds": s,
                    "cells_per_s": len(cells) / s,
                    "mb_per_s": nbytes / s / 1e6,
                }
            )
    stage_rows = []
    for name in ("tpch_orders_text", "tpch_orders_text_short"):
        spec = load_spec(
            ROOT / f"{name}.yaml", [f"source.generate.tpch.scale={args.scale}", f"run.device={args.device}"]
        )
        chain = Chain(spec, open_sources(spec, folder), torch.device(args.device), clock=clock)
        keys, _ = list_root_keys(spec, chain.sources)
        state: dict = {}

        def stages(chain=chain, keys=keys, state=state) -> dict[str, float]:
            """The harness's chain, each step timed into ``out`` (compute: predict only)."""
            out: dict[str, float] = {}

            def record(stage: str, seconds: float, rows: int) -> None:
                out[stage] = seconds

            prepared = chain.prepare(keys, record)
            state["cells"] = prepared.encoded  # text cells (the reference encoder)
            with clock.measure() as s:
                chain.engine.predict(prepared.tz, ("prediction",))
            out["compute"] = s.seconds
            return out

        stages()  # warm-up (fit, first call)
        runs = [stages() for _ in range(args.rounds)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        total = sum(med.values())
        stage_rows.append(
            {
                "workload": name,
                "roots": len(keys),
                "text_cells": state["cells"],
                **{f"{k}_s": v for k, v in med.items()},
                "encode_share": med["encode"] / total,
                "compute_share": med["compute"] / total,
                "encode_over_compute": med["encode"] / med["compute"],
            }
        )
    print(f"hashed encoder, TPC-H scale {args.scale:g}, median of {args.rounds}")
    print(f"{'column':<10} {'dim':>4} {'cells':>8} {'cells/s':>11} {'MB/s':>7}")
    for r in encoder_rows:
        print(f"{r['column']:<10} {r['dim']:>4} {r['cells']:>8,} {r['cells_per_s']:>11,.0f} {r['mb_per_s']:>7.1f}")
    print(f"\npredict stages in-process (no write), device {args.device}, median of {args.rounds}")
    print(
        f"{'workload':<24} {'roots':>6} {'cells':>7} {'retrieve':>9} {'preproc':>8} {'encode':>8} "
        f"{'tensorize':>9} {'compute':>8} {'encode%':>8} {'compute%':>8} {'enc/comp':>8}"
    )
    for r in stage_rows:
        print(
            f"{r['workload']:<24} {r['roots']:>6,} {r['text_cells']:>7,} {r['retrieve_s']:>9.3f} "
            f"{r['preprocess_s']:>8.3f} {r['encode_s']:>8.3f} {r['tensorize_s']:>9.3f} {r['compute_s']:>8.3f} "
            f"{r['encode_share']:>8.1%} {r['compute_share']:>8.1%} {r['encode_over_compute']:>7.2f}x"
        )
    print(json.dumps({"bench": "text", "scale": args.scale, "encoder": encoder_rows, "stages": stage_rows}))


if __name__ == "__main__":
    main()
