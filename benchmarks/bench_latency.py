"""Per-request latency of the default workload by source, and the server at several loads.

What it measures: single_stream request latency (p50/p99 and each step's share: retrieve
by key, preprocess, tensorize, compute, calibrate, write) with the tables read from
Parquet files, the DuckDB file and (with --postgresql) a PostgreSQL server, all serving the
same trained checkpoint and the same seeded request keys; then server runs (Poisson
arrivals) at each --qps, against --server-source, with the LoadGen-style verdict. Every run
is a normal `benchmark` flow run in a fresh process of its own (no warm caches, imports or
connections carried from one configuration to the next), recorded in MLflow under the
current folder.

Before/after: --before names the root of a second checkout (e.g. `git worktree add
/tmp/before main`). Each configuration then runs --rounds times in each tree, alternating
before and after (before, after, after, before, ...), so both see the same host load; the
summary prints the median over rounds of each side's p50/p99 and the ratio after/before.
Every child reports the file its `tasks` package was imported from, and the run stops if
that is not the tree it was meant to measure.

    relflow-bench data tpch --scale 0.01 --into duckdb
    relflow-bench data tpch --scale 0.01 --into postgresql://postgres@127.0.0.1:5432/postgres
    python benchmarks/bench_latency.py --requests 300 --qps 5 200 \\
        --postgresql postgresql://postgres@127.0.0.1:5432/postgres
    python benchmarks/bench_latency.py --before /tmp/before --rounds 3 \\
        --single-stream duckdb --qps

Without --checkpoint it first trains one (a train+predict offline run, this tree). Prints a
table, then the before/after summary (with --before), then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SPEC_NAME = "benchmarks/tpch_orders.yaml"
STEPS = ("retrieve", "preprocess", "tensorize", "compute", "calibrate", "write", "queue")
MARK = "BENCH_LATENCY_RESULT "


def child(config: dict[str, Any]) -> None:
    """One configuration, in this (fresh) process: a benchmark flow run, its result on stdout."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    import tasks
    from flows.benchmark import benchmark
    from tasks.measure import keys as K
    from tasks.spec import load_spec

    tree = Path(config["tree"])
    spec_path = tree / SPEC_NAME
    spec = load_spec(spec_path, ["run.system_metrics_interval_s=0", *config["sets"]])
    s = benchmark(spec=spec.to_dict(), spec_dir=str(spec_path.parent))
    m = s["metrics"]
    outputs = (K.REQUESTS_OUTPUTS_MISMATCHED_ROOTS, K.REQUESTS_OUTPUTS_ROOTS_CHECKED)  # the row's check column
    keep = (K.LATENCY_PREFIX, *outputs, K.DATA_BYTES_READ, K.HOST_LOAD_PER_CORE_START)
    out = {
        "tasks_file": tasks.__file__,
        "run_id": s["run_id"],
        "validity": s["validity"],
        "invalid_reasons": s["invalid_reasons"],
        "checkpoint_path": s.get("checkpoint_path"),
        "metrics": {k: v for k, v in m.items() if k.startswith(keep)},
    }
    print(MARK + json.dumps(out), flush=True)


def run_fresh(tree: Path, sets: list[str]) -> dict[str, Any]:
    """``child`` in a new interpreter that imports ``tree`` (PYTHONPATH), in the current folder."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    config = json.dumps({"tree": str(tree), "sets": sets})
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", config],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"run in {tree} failed (exit {proc.returncode}): {' '.join(sets)}")
    out: dict[str, Any] = json.loads(lines[-1][len(MARK) :])
    if not Path(out["tasks_file"]).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"the run meant for {tree} imported {out['tasks_file']}: not a measurement of that tree")
    return out


def row(label: str, s: dict[str, Any]) -> str:
    from tasks.measure import keys as K

    m = s["metrics"]
    shares = [m.get(K.latency_step_share(st), 0.0) for st in STEPS]
    return (
        f"{label:<38} {int(m[K.LATENCY_REQUESTS]):>5} {m[K.latency_request_ms(50)]:>8.2f} "
        f"{m[K.latency_request_ms(99)]:>8.2f} {m[K.LATENCY_FIRST_REQUEST_MS]:>8.1f} "
        f"{m[K.LATENCY_ACHIEVED_QPS]:>7.1f} {m.get(K.HOST_LOAD_PER_CORE_START, float('nan')):>5.2f}  "
        + " ".join(f"{v:>5.0%}" for v in shares)
        + f" {int(m.get(K.REQUESTS_OUTPUTS_MISMATCHED_ROOTS, -1)):>4}/{int(m.get(K.REQUESTS_OUTPUTS_ROOTS_CHECKED, 0))}"
        + f"  {s['validity']} {'; '.join(s['invalid_reasons'])}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)  # internal: one configuration in this process
    ap.add_argument("--checkpoint", help="a .ckpt of the default workload (else one is trained)")
    ap.add_argument("--postgresql", help="URL of a PostgreSQL loaded with --into (optional)")
    ap.add_argument("--requests", type=int, default=300, help="steady requests per run")
    ap.add_argument("--min-duration", type=float, default=0.0, help="run.request.min_duration_s")
    ap.add_argument("--qps", type=float, nargs="*", default=[5.0, 200.0], help="server loads")
    ap.add_argument("--bound-ms", type=float, default=100.0, help="server latency bound")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--server-source", default="duckdb", help="parquet | duckdb | postgresql")
    ap.add_argument(
        "--single-stream",
        nargs="*",
        default=None,
        help="sources for the single_stream runs (default: every source given)",
    )
    ap.add_argument("--before", type=Path, help="root of a second checkout, measured side by side (before/after)")
    ap.add_argument("--rounds", type=int, default=1, help="runs per configuration and tree")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="extra spec override")
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    after = ROOT
    trees = [("after", after)] + ([("before", args.before.resolve())] if args.before else [])

    ckpt = args.checkpoint
    if ckpt is None:
        trained = run_fresh(after, [*args.sets, "run.min_steady_batches=1", "run.min_steady_seconds=0.000001"])
        ckpt = trained["checkpoint_path"]
    sources = {"parquet": [], "duckdb": ["source.database.url=duckdb"]}
    if args.postgresql:
        sources["postgresql"] = [f"source.database.url={args.postgresql}"]
    base = [
        *args.sets,
        "run.mode=predict",
        f"run.checkpoint={ckpt}",
        "run.min_steady_batches=1",
        "run.min_steady_seconds=0.000001",
        f"run.request.min_requests={args.requests}",
        f"run.request.min_duration_s={args.min_duration}",
    ]
    configs: list[tuple[str, list[str]]] = []
    for name, sets in sources.items():
        if args.single_stream is not None and name not in args.single_stream:
            continue
        configs.append((f"single_stream {name}", [*base, *sets, "run.scenario=single_stream"]))
    for qps in args.qps:
        server = [
            "run.scenario=server",
            f"run.request.target_qps={qps}",
            f"run.request.max_batch={args.max_batch}",
            f"run.request.max_wait_ms={args.max_wait_ms}",
            f"run.request.latency_bound_ms={args.bound_ms}",
        ]
        configs.append((f"server {args.server_source} {qps:g} QPS", [*base, *sources[args.server_source], *server]))

    head = (
        f"{'run':<38} {'reqs':>5} {'p50 ms':>8} {'p99 ms':>8} {'cold ms':>8} {'QPS':>7} {'load':>5}  "
        + " ".join(f"{s[:5]:>5}" for s in STEPS)
        + " mismatched/checked  validity"
    )
    print(head, flush=True)
    results: list[dict[str, Any]] = []
    for label, sets in configs:
        for r in range(args.rounds):
            # alternate which tree goes first, so neither always runs on the warmer host
            for side, tree in trees if r % 2 == 0 else trees[::-1]:
                s = run_fresh(tree, sets)
                tag = f"{label} [{side} {r}]" if args.before else f"{label} [{r}]"
                print(row(tag, s), flush=True)
                results.append({"run": label, "tree": side, "round": r, **s})

    if args.before:
        from tasks.measure.keys import latency_request_ms

        print("\nmedian over rounds (fresh processes, interleaved); ratio = after / before")
        print(
            f"{'run':<26} {'p50 before':>10} {'p50 after':>10} {'ratio':>6} "
            f"{'p99 before':>10} {'p99 after':>10} {'ratio':>6}"
        )
        for label, _ in configs:

            def med(side: str, key: str, label: str = label) -> float:
                return statistics.median(x["metrics"][key] for x in results if x["run"] == label and x["tree"] == side)

            p50, p99 = latency_request_ms(50), latency_request_ms(99)
            p50b, p50a = med("before", p50), med("after", p50)
            p99b, p99a = med("before", p99), med("after", p99)
            print(
                f"{label:<26} {p50b:>10.2f} {p50a:>10.2f} {p50a / p50b:>6.2f} "
                f"{p99b:>10.2f} {p99a:>10.2f} {p99a / p99b:>6.2f}"
            )
    print(json.dumps({"checkpoint": ckpt, "trees": {k: str(v) for k, v in trees}, "runs": results}))


if __name__ == "__main__":
    main()
