"""relflow's automatic packing against its padded path, steady predict, fresh processes.

What: steady predict rows/s of the relflow model of --spec (default: the default workload on
relflow, benchmarks/tpch_orders_relflow.yaml, where the lineitem regions pack: about 56% of
its slots are live) over its first --rows root keys, in two settings that differ only in the
path relflow takes: ``packed`` (relflow as shipped: every eligible encoder region packs its
present coordinates, automatically) and ``padded`` (a no-op global forward pre-hook, which
relflow's ``customized`` test treats as an observed region, so every region keeps the dense
padded + masked shapes; the product note: "regions with nested hooks" stay dense). Each child
prepares the rows through the harness's chain outside every timing (fresh weights: the
forward's cost does not depend on them), then runs the library's predict step batch by batch,
reading the harness's clock around each; first call and ``run.warmup_batches`` dropped; exact
rows / summed step seconds. The child also reports how many encoder regions relflow's own
eligibility test (the driver's ``packing``) says pack: all of them packed, none padded.
Why: issue 41 item 4, the first product note: "Eligible encoder work packs present coordinates
... This is automatic"; the payoff should grow with 1 / occupancy.
How: each setting in its own process, rounds interleaved with the order rotated each round
(benchmarks/bench_crosscheck.py ``rounds``); the ratio packed / padded is the median of each
round's paired ratio (tasks/measure/report.py ``ratio_interval``, its 95% interval from 6 rounds).
The hook costs one Python call per module call (microseconds against a batch's tens of ms).

    python benchmarks/bench_relflow_packing.py --rows 2048 --rounds 3

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

SETTINGS = ("packed", "padded")


def steady_predict(spec_path: Path, rows: int, setting: str, overrides: list[str]) -> dict[str, float]:
    """One child: the path setting, the prepared rows, the timed predict loop."""
    import torch

    from tasks.libraries.engine import LibraryEngine
    from tasks.measure.clock import Clock
    from tasks.run.chain import Chain
    from tasks.sources.files import resolve_sources
    from tasks.sources.open import data_home
    from tasks.spec import load_spec
    from tasks.stages.retrieve import list_root_keys

    spec = load_spec(spec_path, ["run.mode=predict", *overrides])
    home = data_home(spec, spec_path.parent)
    chain = Chain(spec, resolve_sources(spec, home.base), torch.device("cpu"))
    keys, _ = list_root_keys(spec, chain.sources)
    chunk = chain.prepare_untimed(keys[:rows])
    engine = chain.ensure_engine()
    assert isinstance(engine, LibraryEngine), "--spec must name a library (model.library relflow)"
    if setting == "padded":  # relflow's customized(): any global hook keeps every region dense
        torch.nn.modules.module.register_module_forward_pre_hook(lambda module, args: None)
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
    facts = steps.driver.packing(training=False)  # type: ignore[attr-defined]  (relflow: its RelflowDriver)
    packing = float(sum(f.eligible for f in facts))
    return {"rows_per_s": done / seconds, "steady_rows": float(done), "regions": float(len(facts)), "packing": packing}


def measure(setting: str, spec: Path, rows: int, overrides: list[str], seen: dict[str, dict[str, float]]) -> float:
    cmd = [sys.executable, __file__, "--spec", str(spec), "--rows", str(rows), "--child", setting]
    for o in overrides:
        cmd += ["--set", o]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=checkout_env())
    if proc.returncode != 0:
        print(f"  {setting} failed (exit {proc.returncode}): {proc.stderr.strip()[-800:]}", file=sys.stderr)
        return math.nan
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    seen[setting] = got
    return float(got["rows_per_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=ROOT / "tpch_orders_relflow.yaml")
    ap.add_argument("--rows", type=int, default=2048, help="root rows predicted per process")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="spec override, as for run")
    ap.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    spec = args.spec.resolve()
    if args.child:
        print(json.dumps(steady_predict(spec, args.rows, args.child, args.overrides)))
        return
    load_before, cores = os.getloadavg(), os.cpu_count()
    seen: dict[str, dict[str, float]] = {}
    got = rounds(list(SETTINGS), args.rounds, lambda s: measure(s, spec, args.rows, args.overrides, seen))
    load_after = os.getloadavg()
    print(
        f"{spec.name}: relflow steady predict rows/s, {args.rows} rows, {args.rounds} interleaved rounds, "
        f"fresh processes; {cores} cores, load (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}"
    )
    medians = {s: median_interval(list(got[s].values())).median if got[s] else math.nan for s in SETTINGS}
    for s in SETTINGS:
        rates = ", ".join(f"{x:,.1f}" for x in got[s].values())
        regions = seen.get(s, {})
        packs = f"{regions.get('packing', math.nan):.0f} of {regions.get('regions', math.nan):.0f} regions pack"
        print(f"{s:<7} median {medians[s]:>9,.1f} rows/s  ({packs})  rounds {rates}")
    ratio = ratio_interval(got["packed"], got["padded"]) if got["packed"] and got["padded"] else None
    if ratio is not None:
        ci = interval_text(ratio.low, ratio.high, ratio.n, ".3f")
        print(f"packed / padded, rows/s: {ratio.median:.3f} {ci} (> 1: packing faster)")
    print(
        json.dumps(
            {
                "bench": "relflow-packing",
                "spec": spec.name,
                "rows": args.rows,
                "rounds": args.rounds,
                "overrides": args.overrides,
                "rows_per_s": {s: list(got[s].values()) for s in SETTINGS},
                "median_rows_per_s": medians,
                "packed_over_padded": ratio.median if ratio else None,
                "regions_packing": {s: seen.get(s, {}).get("packing") for s in SETTINGS},
                "cores": cores,
                "load_before": load_before,
                "load_after": load_after,
            }
        )
    )


if __name__ == "__main__":
    main()
