"""Bounded memory: peak RSS of a predict run grows with chunk size, not with data size.

Runs `relflow-bench run --set run.mode=predict` at two TPC-H scales with the same
`run.chunk_rows`, each in a fresh process (so nothing is shared or cached in memory), and
compares `memory.host_peak_bytes` (RSS sampled during the run). The claim holds when the
larger scale's peak is at most `--max-ratio` times the smaller one's.

    python benchmarks/bench_memory.py --scales 0.1 1 --chunk-rows 50000

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tasks.measure import keys as K

ROOT = Path(__file__).resolve().parent.parent


def run(scale: float, chunk_rows: int, batch_size: int, workdir: Path) -> dict:
    out = workdir / f"summary-{scale:g}.json"
    cmd = [
        sys.executable,
        "-m",
        "flows.cli",
        "run",
        str(ROOT / "benchmarks" / "tpch_orders.yaml"),
        "--scale",
        str(scale),
        "--set",
        "run.mode=predict",
        "--set",
        f"run.chunk_rows={chunk_rows}",
        "--set",
        f"run.batch_size={batch_size}",
        "--json",
        str(out),
    ]
    subprocess.run(cmd, check=True, cwd=workdir)
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", nargs=2, type=float, default=[0.1, 1.0])
    ap.add_argument("--chunk-rows", type=int, default=50_000)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--max-ratio", type=float, default=2.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="relflow-mem-") as tmp:
        results = [run(s, args.chunk_rows, args.batch_size, Path(tmp)) for s in args.scales]
    rows = []
    for scale, r in zip(args.scales, results, strict=True):
        m = r["metrics"]
        rows.append(
            {
                "scale": scale,
                "root_rows": int(m[K.DATA_ROOT_ROWS]),
                "chunks": int(m[K.DATA_CHUNKS]),
                "host_peak_mib": m[K.HOST_PEAK_BYTES] / 2**20,
                "e2e_rows_per_s": m[K.E2E_PREDICT_ROWS_PER_S],
            }
        )
    print(f"{'scale':>6} {'root rows':>10} {'chunks':>7} {'peak RSS MiB':>13} {'e2e predict rows/s':>19}")
    for r in rows:
        print(
            f"{r['scale']:>6g} {r['root_rows']:>10,} {r['chunks']:>7} {r['host_peak_mib']:>13,.0f} "
            f"{r['e2e_rows_per_s']:>19,.0f}"
        )
    ratio = rows[1]["host_peak_mib"] / rows[0]["host_peak_mib"]
    ok = ratio <= args.max_ratio
    print(f"peak RSS ratio {ratio:.2f} (limit {args.max_ratio}): {'bounded' if ok else 'NOT bounded'}")
    print(json.dumps({"bench": "memory", "rows": rows, "ratio": ratio, "bounded": ok}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
