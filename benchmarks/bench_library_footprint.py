"""Footprint on a library under test: the harness's steady predict against a bare loop.

What: steady predict rows/s of a library's model (``model.library`` of --spec, e.g. relflow)
measured two ways, in fresh processes interleaved over --rounds (order rotated each round):

- ``bare``: the chunk prepared by the harness's own chain outside every timing (relflow:
  ``Model.encode`` of every root row), then a plain loop: slice a batch of ``run.batch_size``
  root rows, run the library's predict forward, read the clock (first call and
  ``run.warmup_batches`` dropped; exact rows / summed step seconds);
- ``harness``: ``relflow-bench run --set run.mode=predict``, its ``compute.steady_rows_per_s``.

The footprint is the median over rounds of ``bare / harness`` (a round's pair shares the
host's state; > 1 means the harness is slower) with its order-statistic 95% interval
(tasks/measure/report.py ``ratio_interval``; from 6 rounds). Goal: within 3%.
Why: the harness must not tax, or measure something other than, what a user's own loop gets.

    python benchmarks/bench_library_footprint.py --spec benchmarks/tpch_orders_relflow.yaml --rounds 6 --threads 1

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
sys.path.insert(0, str(REPO))  # this checkout's tasks/, not an installed copy's
sys.path.insert(0, str(ROOT))

from bench_crosscheck import checkout_env, harness, rounds  # noqa: E402

from tasks.measure.report import interval_text, ratio_interval  # noqa: E402
from tasks.measure.stats import median_interval  # noqa: E402

GOAL = 0.03


def bare(spec_path: Path, threads: int | None) -> float:
    """The bare loop over the harness-prepared chunk (see the module note)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    from tasks.libraries.engine import LibraryEngine
    from tasks.measure.clock import Clock
    from tasks.sources.files import resolve_sources
    from tasks.sources.open import data_home
    from tasks.spec import load_spec
    from tasks.stages.chain import Chain
    from tasks.stages.retrieve import list_root_keys

    spec = load_spec(spec_path, ["run.mode=predict"])
    home = data_home(spec, spec_path.parent)
    chain = Chain(spec, resolve_sources(spec, home.base), torch.device("cpu"))
    keys, _ = list_root_keys(spec, chain.sources)
    chunk = chain.prepare_untimed(keys[: spec.run.chunk_rows])
    engine = chain.ensure_engine()
    assert isinstance(engine, LibraryEngine), "--spec must name a library (model.library)"
    steps, clock = engine.driver, Clock(torch.device("cpu"))
    skip, seconds, rows = 1 + spec.run.warmup_batches, 0.0, 0
    with torch.no_grad():
        for i, (part, n) in enumerate(steps.batches(chunk, torch.arange(chunk.root_rows))):  # type: ignore[arg-type]
            with clock.measure() as span:
                steps.predict_step(part)
            if i >= skip:
                seconds, rows = seconds + span.seconds, rows + n
    return rows / seconds


def measure(variant: str, spec: Path, threads: int) -> float:
    if variant == "harness":
        with tempfile.TemporaryDirectory(prefix="relflow-libfoot-") as d:
            return harness(spec, threads or None, Path(d))
    cmd = [sys.executable, __file__, "--spec", str(spec), "--threads", str(threads), "--child"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=checkout_env())
    if proc.returncode != 0:
        print(f"  bare failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}", file=sys.stderr)
        return math.nan
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["rows_per_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=ROOT / "tpch_orders_relflow.yaml")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1, help="torch threads in both (0 = leave unset)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    spec = args.spec.resolve()
    if args.child:
        print(json.dumps({"rows_per_s": bare(spec, args.threads or None)}))
        return
    load_before = os.getloadavg()
    got = rounds(["bare", "harness"], args.rounds, lambda v: measure(v, spec, args.threads))
    load_after = os.getloadavg()
    ri = ratio_interval(got["bare"], got["harness"])
    print(
        f"{spec.name}: predict steady rows/s, {args.rounds} interleaved rounds, fresh processes, threads "
        f"{args.threads or 'unset'}, load (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}"
    )
    for v in ("bare", "harness"):
        med = median_interval(list(got[v].values())).median
        print(f"{v:<8} median {med:>9,.1f} rows/s  rounds {', '.join(f'{x:,.1f}' for x in got[v].values())}")
    ci = interval_text(ri.low, ri.high, ri.n, ".3f")
    met = abs(ri.median - 1) <= GOAL
    print(f"footprint bare/harness {ri.median:.3f} {ci} (goal within {GOAL:.0%}: {'met' if met else 'missed'})")
    print(
        json.dumps(
            {
                "bench": "library-footprint",
                "spec": spec.name,
                "rounds": args.rounds,
                "threads": args.threads,
                "bare": list(got["bare"].values()),
                "harness": list(got["harness"].values()),
                "footprint": ri.median,
                "ci_low": ri.low,
                "ci_high": ri.high,
                "goal_met": met,
                "load_before": load_before,
                "load_after": load_after,
            }
        )
    )


if __name__ == "__main__":
    main()
