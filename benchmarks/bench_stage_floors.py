"""Retrieve and tensorize against their floors, side by side; with --before, against a second
checkout of the code, each side in fresh processes, interleaved.

What: on the spec's chunks (every root key, cut at run.chunk_rows), the harness's retrieve
(tasks/stages/retrieve.py) against the retrieve floor's plainest reader of the same columns
(``tasks.run.floors._plain_read``: ``pyarrow.parquet.read_table``, DuckDB's ``SELECT``),
and tensorize (tasks/stages/tensorize.py) against a memcpy (``torch.empty_like(t).copy_``)
of the tensors it produced, and preprocess (no floor of its own, timed so that a change that
moves work between stages shows: ``data`` is the three together). Each round times each step once, in alternating order,
so all four see the same host load; the figures are medians over rounds, in wall seconds
and in process CPU seconds (on a loaded host wall time mostly measures the wait for a core).
Why: the floor ledger's fractions (floor.<stage>.fraction) say how far a stage is from its
floor, but one run's figure mixes a cold first call and host noise; this isolates the two
stages. With --before, the change's effect is the ratio after/before of each stage's median
seconds over fresh processes (before, after, after, before, ...).
How:

    python benchmarks/bench_stage_floors.py [--scale 0.01] [--rounds 9]
    git worktree add /tmp/before main
    python benchmarks/bench_stage_floors.py --before /tmp/before --processes 6 --scale 0.1
    python benchmarks/bench_stage_floors.py --before /tmp/before --scale 0.1 --set run.chunk_rows=150000

Prints a table (per process: medians and fractions), then with --before the medians over
processes and the ratios, then one JSON line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT_DIR = Path(__file__).resolve().parent


def _own_clock() -> ModuleType:
    """This checkout's clock module, whichever tree the measured code comes from: both sides
    are timed by the same instrument (an older tree may lack ``process_cpu``)."""
    path = ROOT_DIR.parent / "tasks" / "measure" / "clock.py"
    found = importlib.util.spec_from_file_location("bench_stage_floors_clock", path)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    sys.modules[found.name] = module  # dataclasses look their module up while building
    found.loader.exec_module(module)
    return module


def child(spec_path: Path, scale: float, rounds: int, overrides: list[str]) -> dict[str, float]:
    """One process: the four timings, ``rounds`` interleaved rounds, medians in seconds."""
    import numpy as np
    import torch

    from tasks.run.chain import Chain
    from tasks.run.floors import _plain_read
    from tasks.run.scenarios.workload import chunked
    from tasks.sources.open import open_sources
    from tasks.spec import load_spec
    from tasks.stages.preprocess import preprocess
    from tasks.stages.retrieve import ROOT, list_root_keys, node_columns, retrieve
    from tasks.stages.tensorize import tensorize

    spec = load_spec(spec_path, [f"source.generate.tpch.scale={scale}", *overrides])
    chain = Chain(spec, open_sources(spec, ROOT_DIR), torch.device("cpu"))
    keys, _ = list_root_keys(spec, chain.sources)
    chunks = chunked(np.asarray(keys), spec.run.chunk_rows)  # the workload's one definition of a chunk
    chain.prepare_untimed(chunks[0])  # fits the encoding, as a run's first chunk does
    enc, schema = chain.encoding, chain.schema
    assert enc is not None and schema is not None
    cols = node_columns(spec)
    tables = {ROOT: spec.schema_.root.table} | {b.name: b.table for b, _ in spec.schema_.walk()}
    try:  # a tree that reads category text dictionary-encoded: its floor reads it so too
        from tasks.stages.retrieve import category_columns  # type: ignore[attr-defined,unused-ignore]

        cats = category_columns(spec)
        reads = [_plain_read(chain.sources[t], cols[n], cats[n]) for n, t in tables.items()]  # type: ignore[call-arg,unused-ignore]
    except ImportError:
        reads = [_plain_read(chain.sources[t], cols[n]) for n, t in tables.items()]
    rets = [retrieve(spec, chain.sources, c) for c in chunks]
    pres = [preprocess(spec, r) for r in rets]
    produced = [t for p in pres for t in tensorize(spec, p, enc, schema).tensors()]
    dst = [torch.empty_like(t) for t in produced]
    instrument = _own_clock()
    clock, process_cpu = instrument.Clock(torch.device("cpu")), instrument.process_cpu
    steps = {
        "retrieve": lambda: [retrieve(spec, chain.sources, c) for c in chunks],
        "plain_read": lambda: [read() for read, _ in reads],
        "preprocess": lambda: [preprocess(spec, r) for r in rets],
        "tensorize": lambda: [tensorize(spec, p, enc, schema) for p in pres],
        "memcpy": lambda: [d.copy_(t) for d, t in zip(dst, produced, strict=True)],
    }
    times: dict[str, list[float]] = {k: [] for k in steps} | {f"{k}_cpu": [] for k in steps}
    for step in steps.values():  # one untimed call each: first-call costs are not the floor's
        step()
    for r in range(rounds):
        for name in list(steps) if r % 2 == 0 else reversed(list(steps)):
            cpu = process_cpu()
            with clock.measure() as span:
                steps[name]()
            times[f"{name}_cpu"].append(process_cpu() - cpu)
            times[name].append(span.seconds)
    med = {k: statistics.median(v) for k, v in times.items()}
    retrieve_bytes = sum(retrieve(spec, chain.sources, c).bytes_read for c in chunks)
    return {
        **{f"{k}_s": v for k, v in med.items()},  # wall seconds; <step>_cpu_s: process CPU seconds
        "retrieve_bytes": float(retrieve_bytes),
        "plain_read_bytes": float(sum(n for _, n in reads)),
        "tensor_bytes": float(sum(t.nbytes for t in produced)),
        "chunks": float(len(chunks)),
        "load1": os.getloadavg()[0],
    }


def fractions(m: dict[str, float]) -> tuple[float, float]:
    """(retrieve, tensorize) rate over its floor's rate, as floor.<stage>.fraction."""
    ret = (m["retrieve_bytes"] / m["retrieve_s"]) / (m["plain_read_bytes"] / m["plain_read_s"])
    return ret, m["memcpy_s"] / m["tensorize_s"]


def in_tree(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    """``child`` in a fresh interpreter that imports ``tree``'s code (PYTHONPATH)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, __file__, "--child", "--spec", str(args.spec), "--scale", str(args.scale)]
    cmd += [a for o in args.set for a in ("--set", o)]
    proc = subprocess.run([*cmd, "--rounds", str(args.rounds)], env=env, capture_output=True, text=True, check=True)
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=ROOT_DIR / "tpch_orders.yaml")
    ap.add_argument("--scale", type=float, default=0.01)
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds inside one process")
    ap.add_argument("--before", type=Path, help="root of a second checkout, measured side by side")
    ap.add_argument("--processes", type=int, default=4, help="fresh processes per side (with --before)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--set", action="append", default=[], help="spec override, e.g. run.chunk_rows=150000")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.spec, args.scale, args.rounds, args.set)))
        return
    after = ROOT_DIR.parent
    sides = [("after", after)] + ([("before", args.before.resolve())] if args.before else [])
    runs: dict[str, list[dict[str, float]]] = {s: [] for s, _ in sides}
    n = args.processes if args.before else 1
    print(
        f"{'side':<7} {'retrieve ms':>11} {'plain ms':>9} {'vs floor':>8} {'tensorize ms':>12} {'memcpy ms':>9} "
        f"{'vs floor':>8} {'tz cpu ms':>9} {'prep ms':>8} {'load':>5}"
    )
    for p in range(n):
        order = sides if p % 2 == 0 else list(reversed(sides))
        for side, tree in order:
            m = in_tree(tree, args)
            runs[side].append(m)
            ret, tz = fractions(m)
            print(
                f"{side:<7} {m['retrieve_s'] * 1e3:>11.2f} {m['plain_read_s'] * 1e3:>9.2f} {ret:>8.1%} "
                f"{m['tensorize_s'] * 1e3:>12.2f} {m['memcpy_s'] * 1e3:>9.3f} {tz:>8.1%} "
                f"{m['tensorize_cpu_s'] * 1e3:>9.2f} {m['preprocess_s'] * 1e3:>8.2f} {m['load1']:>5.2f}"
            )
    summary: dict[str, object] = {"bench": "stage_floors", "spec": args.spec.stem, "scale": args.scale, "set": args.set}
    med = {s: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for s, rs in runs.items()}
    summary["median"] = med
    if args.before:
        keys = ("retrieve_s", "retrieve_cpu_s", "preprocess_s", "preprocess_cpu_s", "tensorize_s", "tensorize_cpu_s")
        ratios = {k: med["after"][k] / med["before"][k] for k in keys}
        # the three data stages together, per process (a change may move work between them)
        for cpu in ("", "_cpu"):
            for side in ("after", "before"):
                med[side][f"data{cpu}_s"] = statistics.median(
                    sum(r[f"{st}{cpu}_s"] for st in ("retrieve", "preprocess", "tensorize")) for r in runs[side]
                )
            ratios[f"data{cpu}_s"] = med["after"][f"data{cpu}_s"] / med["before"][f"data{cpu}_s"]
        summary["after_over_before"] = ratios
        print(f"\nmedian over {n} fresh processes a side (interleaved); ratio = after / before")
        for k, v in ratios.items():
            what = "CPU s" if "cpu" in k else "wall s"
            print(
                f"{k.split('_')[0]:<10} {what:<6} before {med['before'][k] * 1e3:8.2f} ms  "
                f"after {med['after'][k] * 1e3:8.2f} ms  ratio {v:.3f}"
            )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
