"""relflow training: the harness's own loop against a Lightning Trainer, same batches, fresh processes.

What: one epoch of relflow training over the training rows among the first --rows root keys
of --spec (default: the default workload on relflow), two ways, each in its own process:

- ``own``: the loop the harness runs (tasks/libraries/relflow/side.py): per batch relflow's
  ``training_step`` + the ``rf.adamw`` step, with relflow's admitted-rows and throughput
  callbacks run at a Trainer's hooks (``RelflowDriver.train_step``);
- ``trainer``: ``RelflowDriver.fit``, a Lightning Trainer the harness owns (epochs 1,
  precision from the spec, no validation, checkpointing or early stopping), over the same
  encoded batches; a harness Callback reads the clock at ``on_train_batch_start/end``.

Both encode the batches first, through the harness's chain (``strata=train``), outside every
timing. Per variant: the median steady batch ms (first call and ``run.warmup_batches``
dropped; own loop: the step; Trainer: its batch hooks) and the epoch's wall seconds (own: the
loop; Trainer: the whole ``fit`` call, its setup, data fetches and hooks included).
Why: issue 33 item 3 asks whether training runs through a Trainer or the harness's loop; the
harness keeps its loop (tasks/libraries/relflow/README.md says why) and this measures the
difference. Rounds interleaved with the order rotated (drift hits both alike); torch threads 1.

    python benchmarks/bench_relflow_trainer.py --rows 2048 --rounds 3

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
sys.path.insert(0, str(REPO))  # this checkout's tasks/, not an installed copy's
sys.path.insert(0, str(ROOT))

from bench_crosscheck import checkout_env  # noqa: E402

from tasks.measure.report import interval_text, ratio_interval  # noqa: E402

VARIANTS = ("own", "trainer")


def one_epoch(spec_path: Path, rows: int, variant: str) -> dict[str, float]:
    """One child: encode the training batches untimed, then train one epoch one way."""
    import lightning.pytorch as lit
    import torch

    torch.set_num_threads(1)
    from tasks.libraries.engine import LibraryEngine
    from tasks.measure.clock import Clock
    from tasks.run.chain import Chain
    from tasks.sources.files import resolve_sources
    from tasks.sources.open import data_home
    from tasks.spec import load_spec
    from tasks.stages.retrieve import list_root_keys

    spec = load_spec(spec_path, ["run.epochs=1"])
    home = data_home(spec, spec_path.parent)
    chain = Chain(spec, resolve_sources(spec, home.base), torch.device("cpu"))
    keys, _ = list_root_keys(spec, chain.sources)
    chunk = chain.prepare(keys[:rows], lambda *_: None, {"phase": "train"}).tz  # strata=train encode
    engine = chain.ensure_engine()
    assert isinstance(engine, LibraryEngine), "--spec must name model.library: relflow"
    steps: Any = engine.driver
    order = torch.nonzero(chunk.is_train).flatten()
    parts = [part for part, _ in steps.batches(chunk, order)]
    clock, seconds = Clock(torch.device("cpu")), list[float]()
    if variant == "own":
        with clock.measure() as wall:
            for part in parts:
                with clock.measure() as span:
                    steps.train_step(part)
                seconds.append(span.seconds)
            steps.end_epoch()
    else:

        class Hooks(lit.Callback):
            def on_train_batch_start(self, *args: object) -> None:
                self.start = clock.read()

            def on_train_batch_end(self, *args: object) -> None:
                seconds.append(clock.read() - self.start)

        with clock.measure() as wall:
            steps.driver.fit(lambda epoch: [p.td for p in parts], callbacks=[Hooks()])
    steady = seconds[1 + spec.run.warmup_batches :]
    if not steady:
        raise SystemExit(f"--rows {rows} leaves no steady batch: give more rows")
    return {
        "steady_batch_ms": statistics.median(steady) * 1e3,
        "epoch_seconds": wall.seconds,
        "batches": float(len(seconds)),
        "train_rows": float(order.numel()),
    }


def measure(variant: str, spec: Path, rows: int) -> dict[str, float] | None:
    cmd = [sys.executable, __file__, "--spec", str(spec), "--rows", str(rows), "--child", variant]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=checkout_env())
    if proc.returncode != 0:
        print(f"  {variant} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}", file=sys.stderr)
        return None
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=ROOT / "tpch_orders_relflow.yaml")
    ap.add_argument("--rows", type=int, default=2048, help="root keys read; their training rows are trained")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    spec = args.spec.resolve()
    if args.child:
        print(json.dumps(one_epoch(spec, args.rows, args.child)))
        return
    load_before = os.getloadavg()
    got: dict[str, dict[int, dict[str, float]]] = {v: {} for v in VARIANTS}
    for r in range(args.rounds):
        for v in VARIANTS[r % 2 :] + VARIANTS[: r % 2]:
            if (out := measure(v, spec, args.rows)) is not None:
                got[v][r] = out
                print(f"  round {r + 1} {v:<8} {out}", file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    print(
        f"{spec.name}: one training epoch over the training rows of {args.rows} keys, {args.rounds} interleaved "
        f"rounds, fresh processes, 1 torch thread; load (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}"
    )
    summary: dict[str, Any] = {}
    for what in ("steady_batch_ms", "epoch_seconds"):
        series = {v: {r: o[what] for r, o in got[v].items()} for v in VARIANTS}
        for v in VARIANTS:
            vals = list(series[v].values())
            med = statistics.median(vals) if vals else math.nan
            print(f"{what:<16} {v:<8} median {med:>9.3f}  rounds {', '.join(f'{x:.3f}' for x in vals)}")
            summary[f"{v}.{what}"] = vals
        ri = ratio_interval(series["trainer"], series["own"])
        if ri is not None:
            print(f"{what:<16} trainer / own {ri.median:.3f} ({interval_text(ri.low, ri.high, ri.n, '.3f')})")
            summary[f"trainer_over_own.{what}"] = ri.median
    print(json.dumps({"bench": "relflow-trainer", "spec": spec.name, "rows": args.rows, "rounds": args.rounds,
                      **summary, "load_before": load_before, "load_after": load_after}))  # fmt: skip


if __name__ == "__main__":
    main()
