"""Task tables plus as-of preprocessing at 1, 4, 16 and 64 seed times: does the time-anchored
data path stay linear in (entity, seed time) rows, and its memory bounded by one chunk?

What: for each TPC-H scale (--scales) and number of seed times N (--seeds), in a fresh process
(this script with ``--child``), the shipped churn workload (benchmarks/tpch_customer_churn.yaml,
schema derived from rel-tpch: customer -> orders (8, as of the seed) -> lineitem (4, as of it))
over a RelBench task written for that configuration: the same customers (every one with an
order at or before the earliest seed time of the largest N) at N seed times 30 days apart
ending at rel-tpch's ``val_timestamp``, labels computed as the shipped task's SQL would
(an order in the next 90 days). The task folder is a temporary copy of rel-tpch's (manifests
copied, ``db/`` a symlink); its rows go in ``train.parquet`` (val and test empty). Timed:

- ``task rows``: materializing the task's rows (tasks/sources/relbench.py ``task_rows``:
  relbench's ``get_table`` per split, the entity columns joined, written to Parquet), once
  (the seconds it returns; listing the root keys is timed apart, ``list_keys_s`` in the JSON);
- ``retrieve`` + ``preprocess`` (tasks/stages/retrieve.py, preprocess.py with the as-of rule
  of tasks/stages/asof.py) over every root row of the chunked workload (``run.chunk_rows``,
  --chunk-rows, fixed across configurations so that 64 seed times span many chunks): the
  median of --repeats passes after one untimed chunk.

Throughput is exact (entity, seed time) rows per second of retrieve + preprocess (wall; per
process CPU second too, every thread, which a loaded host disturbs less). Memory, from
the kernel's resident high-water mark (``VmHWM``): ``setup`` (imports, the task's rows, the key
list); ``chunk``, one chunk's working memory: the mark's rise above the resident memory before
the first (untimed, cold) chunk, the mark reset just before it (``/proc/self/clear_refs`` 5);
``passes``, the highest mark over the timed passes (reset before each chunk, outside the timed
spans); ``peak``, the process's: the larger of setup's and the passes' (``ru_maxrss`` reads the
same mark, which the resets clear, so it is not read apart). Goals (issue 40 point 8), per
scale between the fewest and the most seed times: rows/s within 2x (no quadratic growth in
history length), and the process's peak grown by no more than one chunk's working memory.
``--release-arrow-pool`` (a diagnostic, not the harness's behaviour) returns the Arrow memory
pool's freed pages to the OS after every chunk, untimed, to tell the pool's retained pages from
live memory.
Why: a time-anchored root row is (entity, seed time); the work and memory that grow with the
seed times are the cost the second product note says model-only timing hides.

    python benchmarks/bench_asof.py [--scales 0.01 0.1] [--seeds 1 4 16 64] [--chunk-rows 2048] [--repeats 3]
    python benchmarks/bench_asof.py --scales 0.01 --release-arrow-pool   # the diagnostic variant

Prints a table (one row per configuration as it finishes), the ratios per scale, then one JSON line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT_DIR = Path(__file__).resolve().parent
REPO = ROOT_DIR.parent
SPEC = ROOT_DIR / "tpch_customer_churn.yaml"
TASK = "customer-churn"
SPACING_DAYS = 30
WINDOW_DAYS = 90
THROUGHPUT_GOAL = 2.0  # rows/s at 1 seed time over rows/s at the most: at most this
MIB = 2**20


# -- the child: one configuration ----------------------------------------------------------------


def _status_kib(field: str) -> int:
    """``VmHWM`` / ``VmRSS`` of this process, KiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> bool:
    """Reset this process's resident high-water mark (Linux ``clear_refs`` 5); False: cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def seed_times(val_timestamp: dt.datetime, n: int) -> list[dt.datetime]:
    """``n`` seed times ``SPACING_DAYS`` apart, the last one at ``val_timestamp``."""
    return [val_timestamp - dt.timedelta(days=SPACING_DAYS * k) for k in reversed(range(n))]


def write_task(src: Path, dst: Path, n: int, most: int) -> int:
    """A copy of rel-tpch ``src`` in ``dst`` (``db/`` a symlink) whose churn task holds the same
    customers at ``n`` seed times (module docstring); the customers have an order at or before the
    earliest seed time of ``most`` seed times. Returns the rows written."""
    import polars as pl
    import yaml

    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "manifest.yaml", dst / "manifest.yaml")
    (dst / "db").symlink_to((src / "db").resolve(), target_is_directory=True)
    task_dir = dst / "tasks" / TASK
    task_dir.mkdir(parents=True)
    shutil.copy(src / "tasks" / TASK / "manifest.yaml", task_dir / "manifest.yaml")
    manifest = yaml.safe_load((src / "manifest.yaml").read_text())
    val = dt.datetime.fromisoformat(str(manifest["val_timestamp"]))
    orders = pl.read_parquet(src / "db" / "orders.parquet", columns=["o_custkey", "o_orderdate"]).with_columns(
        pl.col("o_orderdate").cast(pl.Datetime("us"))
    )
    earliest = seed_times(val, most)[0]
    customers = orders.filter(pl.col("o_orderdate") <= earliest)["o_custkey"].unique().sort()
    frames = []
    for t in seed_times(val, n):  # the shipped task's label: an order in (t, t + 90 days]
        window = orders.filter(
            (pl.col("o_orderdate") > t) & (pl.col("o_orderdate") <= t + dt.timedelta(days=WINDOW_DAYS))
        )
        frames.append(
            pl.DataFrame({"c_custkey": customers}).with_columns(
                pl.lit(t).cast(pl.Datetime("ns")).alias("timestamp"),
                pl.col("c_custkey").is_in(window["o_custkey"].implode()).cast(pl.Int32).alias("orders_next_90d"),
            )
        )
    rows = pl.concat(frames).select("timestamp", "c_custkey", "orders_next_90d").sort("timestamp", "c_custkey")
    rows.write_parquet(task_dir / "train.parquet")
    for split in ("val", "test"):
        rows.clear().write_parquet(task_dir / f"{split}.parquet")
    return rows.height


def child(scale: float, n: int, most: int, chunk_rows: int, repeats: int, release_pool: bool) -> dict[str, Any]:
    """One configuration in this (fresh) process: the figures of the module docstring."""
    import numpy as np
    import pyarrow as pa

    from tasks.datasets.relbench_tpch import ensure_rel_tpch
    from tasks.datasets.tpch import ensure_tpch
    from tasks.measure.clock import Clock, process_cpu
    from tasks.run.scenarios.workload import chunked
    from tasks.sources.files import SourceTable
    from tasks.sources.open import data_home, open_relbench
    from tasks.spec import load_spec
    from tasks.stages.preprocess import preprocess
    from tasks.stages.retrieve import list_root_keys, retrieve

    src = ensure_rel_tpch(ensure_tpch(scale)[0])
    with tempfile.TemporaryDirectory(prefix="relflow-asof-") as tmp:
        folder = Path(tmp) / "rel-tpch"
        written = write_task(src, folder, n, most)
        spec = load_spec(
            SPEC,
            [
                f"source.generate.tpch.scale={scale}",
                f"source.relbench.path={folder}",
                f"run.chunk_rows={chunk_rows}",
            ],
        )
        clock = Clock("cpu")
        sources, task_rows_s = open_relbench(spec, ROOT_DIR, data_home(spec, ROOT_DIR))
        rows_table = sources[spec.schema_.root.table]
        assert isinstance(rows_table, SourceTable)  # the task's rows: a Parquet file
        with clock.measure() as span:
            keys, _ = list_root_keys(spec, sources)
        list_keys_s = span.seconds
        try:
            chunks = chunked(np.asarray(keys), spec.run.chunk_rows)
            setup_peak = _status_kib("VmHWM")
            baseline = _status_kib("VmRSS")
            can_reset = _reset_peak()
            preprocess(spec, retrieve(spec, sources, chunks[0]))  # untimed: first calls, one chunk's memory
            if release_pool:
                pa.default_memory_pool().release_unused()
            first_chunk = _status_kib("VmHWM") - baseline
            passes: list[dict[str, float]] = []
            kept: dict[str, int] = {}
            rows, peak = 0, 0
            for _ in range(repeats):
                t = {"retrieve": 0.0, "preprocess": 0.0, "cpu": 0.0}
                rows, kept = 0, {}
                for c in chunks:
                    can_reset = _reset_peak() and can_reset  # outside the timed spans
                    cpu = process_cpu()
                    with clock.measure() as a:
                        r = retrieve(spec, sources, c)
                    with clock.measure() as b:
                        p = preprocess(spec, r)
                    t["cpu"] += process_cpu() - cpu
                    t["retrieve"] += a.seconds
                    t["preprocess"] += b.seconds
                    rows += p.root_rows
                    for name, k in p.child_rows.items():
                        kept[name] = kept.get(name, 0) + k
                    del r, p
                    if release_pool:  # the diagnostic variant (--release-arrow-pool)
                        pa.default_memory_pool().release_unused()
                    peak = max(peak, _status_kib("VmHWM"))
                passes.append(t)
        finally:
            rows_table.files[0].unlink(missing_ok=True)  # the task's rows: this configuration's only
    ret = statistics.median(p["retrieve"] for p in passes)
    pre = statistics.median(p["preprocess"] for p in passes)
    data = statistics.median(p["retrieve"] + p["preprocess"] for p in passes)
    cpu_s = statistics.median(p["cpu"] for p in passes)
    return {
        "scale": scale,
        "seeds": n,
        "entities": written // n,
        "rows": rows,
        "chunks": len(chunks),
        "chunk_rows": spec.run.chunk_rows,
        "task_rows_s": task_rows_s,
        "list_keys_s": list_keys_s,
        "retrieve_s": ret,
        "preprocess_s": pre,
        "data_s": data,
        "rows_per_s": rows / data,
        "cpu_s": cpu_s,  # process CPU seconds of retrieve + preprocess, every thread
        "rows_per_cpu_s": rows / cpu_s,
        "kept_per_row": {k: v / rows for k, v in kept.items()},
        "setup_peak_mib": setup_peak / 1024,
        "baseline_mib": baseline / 1024,
        "chunk_mib": first_chunk / 1024,
        "passes_peak_mib": peak / 1024,
        # the whole process's peak (ru_maxrss reads the same high-water mark, which the resets
        # clear, so it is the larger of setup's and the passes')
        "process_peak_mib": max(setup_peak, peak) / 1024,
        "peak_reset": can_reset,
        "release_arrow_pool": release_pool,
        "repeats": repeats,
        "load1": os.getloadavg()[0],
    }


# -- the parent: fresh processes, the table and the ratios -------------------------------------


def run_child(scale: float, n: int, args: argparse.Namespace) -> dict[str, Any] | None:
    cmd = [sys.executable, __file__, "--child", "--scales", str(scale), "--seeds", str(n)]
    cmd += ["--most", str(max(args.seeds)), "--chunk-rows", str(args.chunk_rows), "--repeats", str(args.repeats)]
    cmd += ["--release-arrow-pool"] if args.release_arrow_pool else []
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        print(
            f"  scale {scale:g}, {n} seed times failed (exit {proc.returncode}): {proc.stderr[-800:]}", file=sys.stderr
        )
        return None
    rec: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return rec


HEADER = (
    f"{'scale':>5} {'seeds':>5} {'rows':>8} {'chunks':>6} {'task rows s':>11} {'retrieve s':>10} "
    f"{'prep s':>7} {'rows/s':>9} {'rows/cpu s':>10} {'orders/row':>10} {'items/row':>9} {'setup MiB':>9} "
    f"{'chunk MiB':>9} {'passes MiB':>10} {'peak MiB':>8}"
)


def table_line(r: Mapping[str, Any]) -> str:
    """One configuration: seconds per pass (medians), rows/s, kept branch rows per root row, and
    memory (setup's peak, one chunk's working memory, the passes' peak, the process's peak)."""
    kept = r["kept_per_row"]
    return (
        f"{r['scale']:>5g} {r['seeds']:>5} {r['rows']:>8,} {r['chunks']:>6} {r['task_rows_s']:>11.2f} "
        f"{r['retrieve_s']:>10.2f} {r['preprocess_s']:>7.2f} {r['rows_per_s']:>9,.0f} {r['rows_per_cpu_s']:>10,.0f} "
        f"{kept.get('orders', math.nan):>10.2f} {kept.get('lineitem', math.nan):>9.2f} "
        f"{r['setup_peak_mib']:>9,.0f} {r['chunk_mib']:>9,.0f} {r['passes_peak_mib']:>10,.0f} "
        f"{r['process_peak_mib']:>8,.0f}"
    )


def ratios(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per scale, between the fewest and the most seed times measured there:

    - ``throughput_ratio``: rows/s at the fewest over rows/s at the most (> 1: slower with more
      seed times); the goal is met when it is at most ``THROUGHPUT_GOAL``;
    - ``process_growth_mib``: the process's peak at the most minus at the fewest, split into
      ``setup_growth_mib`` (imports, the task's rows, the key list) and ``passes_growth_mib``
      (the chunked retrieve + preprocess passes), each the difference of that phase's peaks;
    - ``chunk_mib``: one chunk's working memory at the most (the first chunk's rise of the
      high-water mark above the resident memory before it);
    - the memory goal is met when ``process_growth_mib <= chunk_mib``.
    """
    out: dict[str, dict[str, Any]] = {}
    for scale in sorted({float(r["scale"]) for r in records}):
        rs = sorted((r for r in records if float(r["scale"]) == scale), key=lambda r: int(r["seeds"]))
        if len(rs) < 2:
            continue
        lo, hi = rs[0], rs[-1]
        tput = float(lo["rows_per_s"]) / float(hi["rows_per_s"])

        def growth(field: str, lo: Mapping[str, Any] = lo, hi: Mapping[str, Any] = hi) -> float:
            return float(hi[field]) - float(lo[field])

        chunk = float(hi["chunk_mib"])
        out[f"{scale:g}"] = {
            "seeds": [int(lo["seeds"]), int(hi["seeds"])],
            "rows": [int(lo["rows"]), int(hi["rows"])],
            "throughput_ratio": tput,
            "throughput_goal_met": tput <= THROUGHPUT_GOAL,
            # the same on CPU seconds: on a loaded host wall time also measures the wait for a core
            "cpu_throughput_ratio": float(lo["rows_per_cpu_s"]) / float(hi["rows_per_cpu_s"]),
            "process_ratio": float(hi["process_peak_mib"]) / float(lo["process_peak_mib"]),
            "process_growth_mib": growth("process_peak_mib"),
            "setup_growth_mib": growth("setup_peak_mib"),
            "passes_growth_mib": growth("passes_peak_mib"),
            "chunk_mib": chunk,
            "memory_goal_met": growth("process_peak_mib") <= chunk,
        }
    return out


def ratio_lines(summary: Mapping[str, Mapping[str, Any]]) -> list[str]:
    lines = []
    for scale, s in summary.items():
        few, most = s["seeds"]
        lines.append(
            f"scale {scale}: rows/s at {few} over {most} seed times {s['throughput_ratio']:.2f}x (goal <= "
            f"{THROUGHPUT_GOAL:g}x: {'met' if s['throughput_goal_met'] else 'MISSED'}; on CPU seconds "
            f"{s['cpu_throughput_ratio']:.2f}x); process peak {s['process_ratio']:.2f}x, "
            f"{s['process_growth_mib']:+,.0f} MiB (setup {s['setup_growth_mib']:+,.0f}, passes "
            f"{s['passes_growth_mib']:+,.0f}) against one chunk's {s['chunk_mib']:,.0f} MiB (goal: "
            f"{'met' if s['memory_goal_met'] else 'MISSED'})"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", type=float, nargs="+", default=[0.01, 0.1])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--chunk-rows", type=int, default=2048, help="run.chunk_rows, the same in every configuration")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes per process (median)")
    ap.add_argument(
        "--release-arrow-pool",
        action="store_true",
        help="diagnostic: return Arrow's freed pool pages to the OS after every chunk (untimed)",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--most", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(
            json.dumps(
                child(
                    args.scales[0],
                    args.seeds[0],
                    args.most or args.seeds[0],
                    args.chunk_rows,
                    args.repeats,
                    args.release_arrow_pool,
                )
            )
        )
        return
    load_before = os.getloadavg()
    print(
        f"tpch-customer-churn as-of data path: chunk_rows {args.chunk_rows}, {args.repeats} timed passes per "
        f"fresh process, seed times {SPACING_DAYS} days apart, load (1 min) {load_before[0]:.2f}"
    )
    print(HEADER)
    records = []
    for scale in args.scales:
        for n in sorted(args.seeds):
            got = run_child(scale, n, args)
            if got is not None:
                records.append(got)
                print(table_line(got), flush=True)
    summary = ratios(records)
    for line in ratio_lines(summary):
        print(line)
    print(
        json.dumps(
            {
                "bench": "asof",
                "chunk_rows": args.chunk_rows,
                "repeats": args.repeats,
                "records": records,
                "ratios": summary,
                "load_before": load_before,
                "load_after": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main()
