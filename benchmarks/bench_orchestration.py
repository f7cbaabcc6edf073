"""Orchestration overhead: what Prefect costs around the five stages, as a share of e2e.

What: ``harness.orchestration_seconds`` (the timed body's wall time minus the five stages'
own times: Prefect task calls, state and event bookkeeping, progress events) against the
e2e predict seconds of the same run, plus the per-task-call cost.
Why: every stage must stay a visible Prefect task, but the goal is that orchestration costs
<= 5% of e2e predict at scale 0.1 (3 chunks of 50,000 orders).
How: ``relflow-bench run`` in fresh processes (predict mode, untrained weights: a pure speed
run), --rounds times; medians, with one text bar per round.

    python benchmarks/bench_orchestration.py --scale 0.1 --rounds 3

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


def one_run(spec: Path, scale: float, extra: list[str], folder: Path) -> dict[str, float]:
    out = folder / "summary.json"
    sets = ["run.mode=predict", f"source.generate.tpch.scale={scale}", "run.system_metrics_interval_s=0", *extra]
    cmd = [sys.executable, "-m", "flows.cli", "run", str(spec), "--json", str(out)]
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}"}
    subprocess.run(cmd, cwd=folder, env=env, check=True, capture_output=True, text=True)
    m = json.loads(out.read_text())["metrics"]
    e2e = m[K.E2E_PREDICT_SECONDS]
    orchestration = m[K.HARNESS_ORCHESTRATION_SECONDS]
    calls = 5 * m[K.DATA_CHUNKS]
    return {
        "e2e_predict_seconds": e2e,
        "orchestration_seconds": orchestration,
        "share": orchestration / e2e,
        "per_task_call_ms": 1e3 * orchestration / calls,
        # building the model once the schema is known: timed region, but neither orchestration nor e2e
        "engine_setup_seconds": m.get(K.HARNESS_ENGINE_SETUP_SECONDS, float("nan")),
        "chunks": m[K.DATA_CHUNKS],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=ROOT / "tpch_orders.yaml")
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    args = ap.parse_args()
    runs = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="relflow-orch-") as d:
            runs.append(one_run(args.spec.resolve(), args.scale, args.sets, Path(d)))
    print(
        f"{args.spec.name} scale {args.scale:g}, predict, {int(runs[0]['chunks'])} chunks, {args.rounds} fresh "
        f"processes, load {os.getloadavg()[0]:.2f}; goal: orchestration <= 5% of e2e predict"
    )
    for i, r in enumerate(runs):
        bar = "#" * min(int(round(r["share"] * 200)), 60)
        print(
            f"round {i + 1}  e2e {r['e2e_predict_seconds']:7.2f} s  "
            f"orchestration {r['orchestration_seconds']:6.3f} s "
            f"{r['share']:6.1%}  {r['per_task_call_ms']:6.1f} ms/task call  |{bar:<20}| 5%=|{'#' * 10}  "
            f"(engine set-up {r['engine_setup_seconds']:.3f} s, not orchestration)"
        )
    share = statistics.median(r["share"] for r in runs)
    print(f"median orchestration share {share:.1%} ({'meets' if share <= 0.05 else 'misses'} the 5% goal)")
    print(
        json.dumps(
            {
                "bench": "orchestration",
                "scale": args.scale,
                "rounds": runs,
                "median_share": share,
                "goal_met": share <= 0.05,
            }
        )
    )


if __name__ == "__main__":
    main()
