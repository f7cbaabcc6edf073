"""Cross-check: the harness's steady predict throughput against an independent plain loop.

What: ``compute.steady_rows_per_s`` of a ``relflow-bench run`` (predict mode) vs the same
model (same seed, packing, batch size) on the same batches (same stage code, key order),
timed by a plain loop outside the harness: clock module, first call + ``run.warmup_batches``
dropped, exact rows / summed step seconds. Both in fresh processes with the same thread
settings (nothing set unless --threads), interleaved over --rounds.
Why: a harness can add overhead of its own (Prefect, tracking threads, memory sampling) or
measure a different thing than a user's own loop; the two must agree within 5%.

    python benchmarks/bench_crosscheck.py --rounds 3 [--spec benchmarks/tpch_orders.yaml]

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tasks.measure import keys as K

ROOT = Path(__file__).resolve().parent


def outside(spec_path: Path, threads: int | None) -> float:
    import torch

    if threads:
        torch.set_num_threads(threads)
    sys.path.insert(0, str(ROOT))
    from batches import build_model, load

    from tasks.measure.clock import Clock

    spec, schema, parts = load(spec_path, ["run.mode=predict"])
    model = build_model(spec, schema)
    clock = Clock("cpu")
    skip = 1 + spec.run.warmup_batches
    seconds, rows = 0.0, 0
    with torch.no_grad():
        for i, part in enumerate(parts):
            with clock.measure() as span:
                outs = model(part, outputs=("prediction",))
                {k: v.float().to("cpu") for k, v in outs.items()}
            if i >= skip:
                seconds, rows = seconds + span.seconds, rows + part.size
    return rows / seconds


def harness(spec_path: Path, threads: int | None, folder: Path) -> float:
    out = folder / "summary.json"
    sets = ["run.mode=predict", "run.system_metrics_interval_s=0"]
    if threads:
        sets.append(f"run.threads.intra_op={threads}")
    cmd = [sys.executable, "-m", "flows.cli", "run", str(spec_path), "--json", str(out)]
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}"}
    subprocess.run(cmd, cwd=folder, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.read_text())["metrics"][K.STEADY_ROWS_PER_S]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=ROOT / "tpch_orders.yaml")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="set torch threads in both (0 = leave unset)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    spec = args.spec.resolve()
    if args.child:
        print(json.dumps({"rows_per_s": outside(spec, args.threads or None)}))
        return
    h, o = [], []
    for r in range(args.rounds):
        for which in ("harness", "outside") if r % 2 == 0 else ("outside", "harness"):
            if which == "harness":
                with tempfile.TemporaryDirectory(prefix="relflow-xcheck-") as d:
                    h.append(harness(spec, args.threads or None, Path(d)))
            else:
                proc = subprocess.run(
                    [sys.executable, __file__, "--spec", str(spec), "--threads", str(args.threads), "--child"],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                o.append(json.loads(proc.stdout.strip().splitlines()[-1])["rows_per_s"])
    hm, om = statistics.median(h), statistics.median(o)
    ratio = om / hm
    print(
        f"{spec.name}: predict steady rows/s, {args.rounds} interleaved rounds, fresh processes, threads "
        f"{args.threads or 'unset'}, load {os.getloadavg()[0]:.2f}"
    )
    print(f"{'measurement':<28} {'median rows/s':>14}  rounds")
    print(f"{'harness (MLflow metric)':<28} {hm:>14,.0f}  {', '.join(f'{x:,.0f}' for x in h)}")
    print(f"{'plain loop outside':<28} {om:>14,.0f}  {', '.join(f'{x:,.0f}' for x in o)}")
    print(f"outside / harness = {ratio:.3f} (goal within 5%: {'met' if abs(ratio - 1) <= 0.05 else 'missed'})")
    print(
        json.dumps(
            {
                "bench": "crosscheck",
                "spec": spec.name,
                "harness": h,
                "outside": o,
                "ratio": ratio,
                "goal_met": abs(ratio - 1) <= 0.05,
            }
        )
    )


if __name__ == "__main__":
    main()
