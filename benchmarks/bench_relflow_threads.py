"""relflow's steady predict at 1 vs 2 torch threads (and torch's default), fresh processes.

What: steady predict rows/s of the relflow model of --spec (default: the default workload on
relflow, benchmarks/tpch_orders_relflow.yaml) over its first --rows root keys, with its
thread setting as the only difference: ``torch.set_num_threads(1)``, ``torch.set_num_threads(2)``
and nothing set (torch's default; the child reports what that was). Each child prepares the
rows through the harness's chain outside every timing (relflow: ``Model.encode`` of every
row, fresh weights: predict without a checkpoint, the forward's cost does not depend on them),
then runs the library's predict step batch by batch (``run.batch_size`` rows), reading the
harness's clock around each; first call and ``run.warmup_batches`` dropped; exact rows /
summed step seconds.
Why: issue 33 item 7 (the first product note measured every step 10-16x slower at 2 threads
on a loaded host; the reference model's thread effect is benchmarks/bench_threads.py).
How: each setting in its own process (thread pools are process state), rounds interleaved
with the order rotated each round (drift hits every setting alike); the host's load average
is printed before and after, since on a shared host it decides the result.

    python benchmarks/bench_relflow_threads.py --rows 2048 --rounds 3

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
sys.path.insert(0, str(REPO))  # this checkout's tasks/, not an installed copy's
sys.path.insert(0, str(ROOT))

from bench_crosscheck import checkout_env, rounds  # noqa: E402

from tasks.measure.report import interval_text, ratio_interval  # noqa: E402
from tasks.measure.stats import median_interval  # noqa: E402

SETTINGS = ("1", "2", "unset")


def steady_predict(spec_path: Path, rows: int, setting: str) -> dict[str, float]:
    """One child: the thread setting, the prepared rows, the timed predict loop."""
    import torch

    if setting != "unset":
        torch.set_num_threads(int(setting))
    from tasks.libraries.engine import LibraryEngine
    from tasks.measure.clock import Clock
    from tasks.run.chain import Chain
    from tasks.sources.files import resolve_sources
    from tasks.sources.open import data_home
    from tasks.spec import load_spec
    from tasks.stages.retrieve import list_root_keys

    spec = load_spec(spec_path, ["run.mode=predict"])
    home = data_home(spec, spec_path.parent)
    chain = Chain(spec, resolve_sources(spec, home.base), torch.device("cpu"))
    keys, _ = list_root_keys(spec, chain.sources)
    chunk = chain.prepare_untimed(keys[:rows])
    engine = chain.ensure_engine()
    assert isinstance(engine, LibraryEngine), "--spec must name a library (model.library)"
    steps, clock = engine.driver, Clock(torch.device("cpu"))
    skip, seconds, done = 1 + spec.run.warmup_batches, 0.0, 0
    with torch.no_grad():
        for i, (part, n) in enumerate(steps.batches(chunk, torch.arange(chunk.root_rows))):  # type: ignore[arg-type]
            with clock.measure() as span:
                steps.predict_step(part)
            if i >= skip:
                seconds, done = seconds + span.seconds, done + n
    if done == 0:
        raise SystemExit(f"--rows {rows} leaves no steady batch: use more than {skip} x run.batch_size rows")
    return {"rows_per_s": done / seconds, "threads": float(torch.get_num_threads()), "steady_rows": float(done)}


def measure(setting: str, spec: Path, rows: int, seen: dict[str, float]) -> float:
    cmd = [sys.executable, __file__, "--spec", str(spec), "--rows", str(rows), "--child", setting]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=checkout_env())
    if proc.returncode != 0:
        print(f"  {setting} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}", file=sys.stderr)
        return math.nan
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    seen[setting] = got["threads"]
    return float(got["rows_per_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=ROOT / "tpch_orders_relflow.yaml")
    ap.add_argument("--rows", type=int, default=2048, help="root rows predicted per process")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    spec = args.spec.resolve()
    if args.child:
        print(json.dumps(steady_predict(spec, args.rows, args.child)))
        return
    load_before, cores = os.getloadavg(), os.cpu_count()
    threads: dict[str, float] = {}
    got = rounds(list(SETTINGS), args.rounds, lambda s: measure(s, spec, args.rows, threads))
    load_after = os.getloadavg()
    print(
        f"{spec.name}: relflow steady predict rows/s, {args.rows} rows, {args.rounds} interleaved rounds, "
        f"fresh processes; {cores} cores, load (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}"
    )
    medians = {s: median_interval(list(got[s].values())).median if got[s] else math.nan for s in SETTINGS}
    for s in SETTINGS:
        label = f"set {s}" if s != "unset" else f"unset ({threads.get(s, math.nan):.0f})"
        rates = ", ".join(f"{x:,.1f}" for x in got[s].values())
        print(f"{label:<10} median {medians[s]:>9,.1f} rows/s  rounds {rates}")
    ratio = ratio_interval(got["2"], got["1"]) if got["1"] and got["2"] else None
    if ratio is not None:
        ci = interval_text(ratio.low, ratio.high, ratio.n, ".3f")
        print(f"2 threads / 1 thread, rows/s: {ratio.median:.3f} {ci} (> 1: 2 threads faster)")
    print(
        json.dumps(
            {
                "bench": "relflow-threads",
                "spec": spec.name,
                "rows": args.rows,
                "rounds": args.rounds,
                "rows_per_s": {s: list(got[s].values()) for s in SETTINGS},
                "median_rows_per_s": medians,
                "default_threads": threads.get("unset"),
                "two_over_one": ratio.median if ratio else None,
                "cores": cores,
                "load_before": load_before,
                "load_after": load_after,
            }
        )
    )


if __name__ == "__main__":
    main()
