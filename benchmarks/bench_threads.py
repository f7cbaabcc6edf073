"""Thread settings side by side: torch's default vs explicit settings, fresh processes.

What: steady predict (and train-step) time per batch of the default workload's model on its
real batches, under thread settings that should be equivalent: nothing set (torch's
default), ``torch.set_num_threads(N)`` with N equal to the default, ``OMP_NUM_THREADS=N`` in
the environment, one thread, and explicit N with ``OMP_WAIT_POLICY=PASSIVE``.
Why: an explicit thread setting equal to the default was measured 1.67x slower on a 2-core
host; an outside check that sets threads (``torch.utils.benchmark.Timer(num_threads=...)``)
can then disagree with the harness by that factor. The harness leaves threads unset by
default and records what was in force; this script measures the effect on this host.
How: each variant in its own fresh process (thread pools are process state), rounds
interleaved so drift hits every variant alike, 3 warm-up batches dropped, median ms.

    python benchmarks/bench_threads.py --rounds 3 [--spec benchmarks/tpch_orders.yaml]

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def variants(n: int) -> dict[str, tuple[dict[str, str], int | None]]:
    """name -> (extra environment, intra-op threads to set in-process or None)."""
    return {
        "default (nothing set)": ({}, None),
        f"set_num_threads({n})": ({}, n),
        f"OMP_NUM_THREADS={n}": ({"OMP_NUM_THREADS": str(n)}, None),
        f"set_num_threads({n}) + OMP_WAIT_POLICY=PASSIVE": ({"OMP_WAIT_POLICY": "PASSIVE"}, n),
        "set_num_threads(1)": ({}, 1),
    }


def child(spec: Path, threads: int | None, batches: int) -> dict[str, float]:
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    sys.path.insert(0, str(ROOT))
    from batches import build_model, load

    from tasks.measure.clock import Clock

    s, schema, parts = load(spec)
    model = build_model(s, schema)
    clock = Clock("cpu")
    parts = parts[:batches]
    out: dict[str, float] = {"threads": torch.get_num_threads()}
    with torch.no_grad():
        times = []
        for i, part in enumerate(parts):
            with clock.measure() as span:
                model(part, outputs=("prediction",))
            if i >= 3:
                times.append(span.seconds)
    out["predict_ms"] = statistics.median(times) * 1e3
    out["predict_rows_per_s"] = sum(p.size for p in parts[3:]) / sum(times)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times = []
    for i, part in enumerate(parts[: max(batches // 2, 6)]):
        with clock.measure() as span:
            loss = model.loss(part, model(part, outputs=("prediction",)))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if i >= 3:
            times.append(span.seconds)
    out["train_ms"] = statistics.median(times) * 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=ROOT / "tpch_orders.yaml")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.spec, int(args.child) or None, args.batches)))
        return
    n = os.cpu_count() or 1
    grid = variants(n)
    samples: dict[str, list[dict[str, float]]] = {k: [] for k in grid}
    for r in range(args.rounds):
        names = list(grid) if r % 2 == 0 else list(reversed(grid))
        for name in names:
            env_extra, threads = grid[name]
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
            env.update(env_extra)
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--spec",
                    str(args.spec),
                    "--batches",
                    str(args.batches),
                    "--child",
                    str(threads or 0),
                ],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            samples[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    base = statistics.median(x["predict_ms"] for x in samples["default (nothing set)"])
    base_train = statistics.median(x["train_ms"] for x in samples["default (nothing set)"])
    rows = []
    for name, xs in samples.items():
        pm = statistics.median(x["predict_ms"] for x in xs)
        tm = statistics.median(x["train_ms"] for x in xs)
        rows.append(
            {
                "variant": name,
                "threads": int(xs[0]["threads"]),
                "predict_ms": pm,
                "predict_rows_per_s": statistics.median(x["predict_rows_per_s"] for x in xs),
                "predict_vs_default": pm / base,
                "train_ms": tm,
                "train_vs_default": tm / base_train,
                "predict_ms_range": [min(x["predict_ms"] for x in xs), max(x["predict_ms"] for x in xs)],
            }
        )
    load = os.getloadavg()[0]
    print(
        f"{args.spec.name}: {args.rounds} interleaved rounds, fresh process per variant, "
        f"{os.cpu_count()} cores, load {load:.2f}"
    )
    print(f"{'variant':<44} {'thr':>3} {'predict ms':>10} {'x default':>9} {'train ms':>9} {'x default':>9}")
    for r in rows:
        print(
            f"{r['variant']:<44} {r['threads']:>3} {r['predict_ms']:>10.1f} {r['predict_vs_default']:>8.2f}x "
            f"{r['train_ms']:>9.1f} {r['train_vs_default']:>8.2f}x"
        )
    print(
        json.dumps({"bench": "threads", "spec": args.spec.name, "rounds": args.rounds, "load_1m": load, "rows": rows})
    )


if __name__ == "__main__":
    main()
