"""Per-request latency of the default workload by source, and the server at several loads.

What it measures: single_stream request latency (p50/p99 and each step's share: retrieve
by key, preprocess, tensorize, compute, calibrate, write) with the tables read from
Parquet files, the DuckDB file and (with --postgresql) a PostgreSQL server, all serving the
same trained checkpoint and the same seeded request keys; then server runs (Poisson
arrivals) at each --qps, against --server-source, with the LoadGen-style verdict. Every run
is a normal `benchmark` flow run in this one process, one after another (side by side:
the same host load, the same model), recorded in MLflow under the current folder.

    relflow-bench data tpch --scale 0.01 --into duckdb
    relflow-bench data tpch --scale 0.01 --into postgresql://postgres@127.0.0.1:5432/postgres
    python benchmarks/bench_latency.py --requests 300 --qps 5 200 \\
        --postgresql postgresql://postgres@127.0.0.1:5432/postgres

Without --checkpoint it first trains one (a train+predict offline run). Prints a table,
then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from tasks.measure import keys as K

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "benchmarks" / "tpch_orders.yaml"
STEPS = ("retrieve", "preprocess", "tensorize", "compute", "calibrate", "write", "queue")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    ap.add_argument("--set", dest="sets", action="append", default=[], help="extra spec override")
    args = ap.parse_args()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from flows.benchmark import benchmark
    from tasks.measure.environment import host_load_per_core
    from tasks.spec import load_spec

    def go(sets: list[str]) -> dict:
        spec = load_spec(SPEC, ["run.system_metrics_interval_s=0", *args.sets, *sets])
        return benchmark(spec=spec.to_dict(), spec_dir=str(SPEC.parent))

    ckpt = args.checkpoint
    if ckpt is None:
        ckpt = go(["run.min_steady_batches=1", "run.min_steady_seconds=0.000001"])["checkpoint_path"]
    sources = {"parquet": [], "duckdb": ["source.database.url=duckdb"]}
    if args.postgresql:
        sources["postgresql"] = [f"source.database.url={args.postgresql}"]
    base = [
        "run.mode=predict",
        f"run.checkpoint={ckpt}",
        "run.min_steady_batches=1",
        "run.min_steady_seconds=0.000001",
        f"run.request.min_requests={args.requests}",
        f"run.request.min_duration_s={args.min_duration}",
    ]
    rows = []
    for name, sets in sources.items():
        if args.single_stream is not None and name not in args.single_stream:
            continue
        s = go([*base, *sets, "run.scenario=single_stream"])
        rows.append((f"single_stream {name}", s))
    for qps in args.qps:
        s = go(
            [
                *base,
                *sources[args.server_source],
                "run.scenario=server",
                f"run.request.target_qps={qps}",
                f"run.request.max_batch={args.max_batch}",
                f"run.request.max_wait_ms={args.max_wait_ms}",
                f"run.request.latency_bound_ms={args.bound_ms}",
            ]
        )
        rows.append((f"server {args.server_source} {qps:g} QPS", s))
    head = (
        f"{'run':<30} {'reqs':>5} {'p50 ms':>8} {'p99 ms':>8} {'cold ms':>8} {'QPS':>7}  "
        + " ".join(f"{s[:5]:>5}" for s in STEPS)
        + "  validity"
    )
    print(head)
    out = []
    for label, s in rows:
        m = s["metrics"]
        shares = {st: m.get(f"latency.step_share.{st}", 0.0) for st in STEPS}
        print(
            f"{label:<30} {int(m['latency.requests']):>5} {m['latency.request_ms.p50']:>8.2f} "
            f"{m['latency.request_ms.p99']:>8.2f} {m['latency.first_request_ms']:>8.1f} "
            f"{m['latency.achieved_qps']:>7.1f}  "
            + " ".join(f"{v:>5.0%}" for v in shares.values())
            + f"  {s['validity']} {'; '.join(s['invalid_reasons'])}"
        )
        out.append(
            {
                "run": label,
                "run_id": s["run_id"],
                "validity": s["validity"],
                **{
                    k: v
                    for k, v in m.items()
                    if k.startswith(("latency.", K.DATA_BYTES_READ, K.HOST_LOAD_PER_CORE_START))
                },
            }
        )
    print(json.dumps({"checkpoint": ckpt, "host_load_per_core_now": host_load_per_core(), "runs": out}))


if __name__ == "__main__":
    main()
