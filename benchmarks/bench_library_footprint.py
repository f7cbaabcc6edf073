"""Footprint on a library under test: the harness's steady predict against a bare loop.

What: steady predict rows/s of a library's model (``model.library`` of --spec, e.g. relflow)
measured two ways, in fresh processes interleaved over --rounds (order rotated each round):

- ``bare``: the chunk prepared by the harness's own chain outside every timing (relflow:
  ``Model.encode`` of every root row; relational-transformers: the collated batches), then a
  plain loop that calls only the library's own API, no harness code inside the clock:
  relflow's ``Model.forward(td, strata=predict)`` under ``torch.inference_mode`` (what its
  ``predict_step`` runs before writing Arrow), relational-transformers'
  ``RelationalTransformer.predict(batch, activation="identity")``; batches of
  ``run.batch_size`` root rows, first call and ``run.warmup_batches`` dropped, exact rows /
  summed call seconds;
- ``bare_frozen``: the same loop inside the harness's own collector policy
  (``tasks/measure/gcpauses.frozen_collector``: collect, ``gc.freeze()``, as the harness's timed
  region does), so the harness's bookkeeping and its GC policy are told apart;
- ``harness``: ``relflow-bench run --set run.mode=predict``, its ``compute.steady_rows_per_s``.

The footprint is the median over rounds of ``bare / harness`` (a round's pair shares the
host's state; > 1 means the harness is slower) with its order-statistic 95% interval
(tasks/measure/report.py ``ratio_interval``; from 6 rounds). Goal: within 3%, said ``met`` only
when the whole interval is inside it (``goal_verdict``), ``missed`` when wholly outside, else
``unresolved``: a median inside the goal with an interval spanning 0.93..1.08 proves nothing. Beside it,
``bare_frozen / harness`` (the harness's cost at the same GC policy) and ``bare / bare_frozen``
(what freezing the collector alone buys a plain loop: > 1 would mean the harness's figure gains
from a policy a user's loop lacks).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
sys.path.insert(0, str(REPO))  # this checkout's tasks/, not an installed copy's
sys.path.insert(0, str(ROOT))

from bench_crosscheck import checkout_env, harness, rounds  # noqa: E402

from tasks.measure.report import interval_text, ratio_interval  # noqa: E402
from tasks.measure.stats import median_interval  # noqa: E402

GOAL = 0.03
VARIANTS = ("bare", "bare_frozen", "harness")


def goal_verdict(low: float | None, high: float | None, goal: float = GOAL) -> str:
    """``met`` only when the ratio's whole 95% interval lies within ``1 +- goal``; ``missed``
    when it lies wholly outside; else ``unresolved`` (the median alone says neither), as it is
    with too few rounds for an interval."""
    if low is None or high is None:
        return "unresolved (too few rounds for an interval)"
    if 1 - goal <= low and high <= 1 + goal:
        return "met"
    if high < 1 - goal or low > 1 + goal:
        return "missed"
    return "unresolved (the interval spans the goal's edge)"


def library_call(engine: Any) -> Callable[[Any], object]:
    """One batch through the library's own predict API, without the harness's driver step (its
    throughput hooks, output reduction and calibration conventions): the loop a user of the
    library writes."""
    import torch

    driver = engine.driver.driver  # the library side's driver, holding the library's model
    if not hasattr(driver, "transformer"):  # relflow's driver holds a LightningModule
        from relflow.structs.enums import Strata

        model = driver.model
        model.eval()

        def relflow_forward(part: Any) -> object:
            with torch.inference_mode():
                return model(part.td, strata=Strata.predict)

        return relflow_forward
    from tasks.libraries.relational_transformers.driver import HEAD

    transformer = driver.transformer
    head = HEAD if driver.kind == "category" else None

    def rt_predict(part: Any) -> object:
        return transformer.predict(part.batch, task_head=head, activation="identity", convert_to_numpy=False)

    return rt_predict


def bare(spec_path: Path, threads: int | None, frozen: bool) -> float:
    """The bare loop over the harness-prepared chunk (see the module note); ``frozen``: inside
    the harness's collector policy."""
    from contextlib import nullcontext

    import torch

    if threads:
        torch.set_num_threads(threads)
    from tasks.libraries.engine import LibraryEngine
    from tasks.measure.clock import Clock
    from tasks.measure.gcpauses import frozen_collector
    from tasks.run.chain import Chain
    from tasks.sources.files import resolve_sources
    from tasks.sources.open import data_home
    from tasks.spec import load_spec
    from tasks.stages.retrieve import list_root_keys

    spec = load_spec(spec_path, ["run.mode=predict"])
    home = data_home(spec, spec_path.parent)
    chain = Chain(spec, resolve_sources(spec, home.base), torch.device("cpu"))
    keys, _ = list_root_keys(spec, chain.sources)
    chunk = chain.prepare_untimed(keys[: spec.run.chunk_rows])
    engine = chain.ensure_engine()
    assert isinstance(engine, LibraryEngine), "--spec must name a library (model.library)"
    steps, clock = engine.driver, Clock(torch.device("cpu"))
    call = library_call(engine)
    skip, seconds, rows = 1 + spec.run.warmup_batches, 0.0, 0
    with torch.no_grad(), frozen_collector(clock) if frozen else nullcontext():
        for i, (part, n) in enumerate(steps.batches(chunk, torch.arange(chunk.root_rows))):  # type: ignore[arg-type]
            with clock.measure() as span:
                call(part)
            if i >= skip:
                seconds, rows = seconds + span.seconds, rows + n
    return rows / seconds


def measure(variant: str, spec: Path, threads: int) -> float:
    if variant == "harness":
        with tempfile.TemporaryDirectory(prefix="relflow-libfoot-") as d:
            return harness(spec, threads or None, Path(d))
    cmd = [sys.executable, __file__, "--spec", str(spec), "--threads", str(threads), "--child", variant]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=checkout_env())
    if proc.returncode != 0:
        print(f"  {variant} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}", file=sys.stderr)
        return math.nan
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["rows_per_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=ROOT / "tpch_orders_relflow.yaml")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1, help="torch threads in both (0 = leave unset)")
    ap.add_argument("--child", choices=VARIANTS[:2], help=argparse.SUPPRESS)
    args = ap.parse_args()
    spec = args.spec.resolve()
    if args.child:
        print(json.dumps({"rows_per_s": bare(spec, args.threads or None, args.child == "bare_frozen")}))
        return
    load_before = os.getloadavg()
    got = rounds(list(VARIANTS), args.rounds, lambda v: measure(v, spec, args.threads))
    load_after = os.getloadavg()
    ri = ratio_interval(got["bare"], got["harness"])
    if ri is None:
        sys.exit("no round where both bare and harness finished: see the failures above")
    print(
        f"{spec.name}: predict steady rows/s, {args.rounds} interleaved rounds, fresh processes, threads "
        f"{args.threads or 'unset'}, load (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}"
    )
    for v in VARIANTS:
        med = median_interval(list(got[v].values())).median
        print(f"{v:<11} median {med:>9,.1f} rows/s  rounds {', '.join(f'{x:,.1f}' for x in got[v].values())}")
    ci = interval_text(ri.low, ri.high, ri.n, ".3f")
    met = goal_verdict(ri.low, ri.high)
    print(f"footprint bare/harness {ri.median:.3f} {ci} (goal within {GOAL:.0%}: {met})")
    others = {}
    for a, b in (("bare_frozen", "harness"), ("bare", "bare_frozen")):
        r2 = ratio_interval(got[a], got[b])
        if r2 is None:  # no round where both finished
            continue
        others[f"{a}/{b}"] = {"median": r2.median, "ci_low": r2.low, "ci_high": r2.high}
        print(f"          {a}/{b} {r2.median:.3f} {interval_text(r2.low, r2.high, r2.n, '.3f')}")
    print(
        json.dumps(
            {
                "bench": "library-footprint",
                "spec": spec.name,
                "rounds": args.rounds,
                "threads": args.threads,
                "bare": list(got["bare"].values()),
                "bare_frozen": list(got["bare_frozen"].values()),
                "harness": list(got["harness"].values()),
                "ratios": others,
                "footprint": ri.median,
                "ci_low": ri.low,
                "ci_high": ri.high,
                "goal": met,
                "load_before": load_before,
                "load_after": load_after,
            }
        )
    )


if __name__ == "__main__":
    main()
