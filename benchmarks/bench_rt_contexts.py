"""relational-transformers contexts per second: the harness's nested builder against
relational-transformers-utils 0.1.0's (``model.rt.context.builder: nested | rt_utils``).

What: the shipped temporal workload (benchmarks/tpch_customer_churn.yaml: rel-tpch customers at
their seed times, RT's spec model) with ``model.library relational_transformers``. In a fresh
process per builder and round (this script with ``--child``), the first --rows root keys are
read and preprocessed untimed (the harness's retrieve and as-of preprocess: the nested rows both
builders start from), then the relational-transformers side's encode step (the ``encode`` stage
row: contexts, then their strings' vectors) runs twice over the same rows:

- ``cold``: the first call: nested fits its statistics; rt_utils also reads every table of the
  graph and builds the library's ColumnarStore and ContextGraph (``store_s`` in the JSON);
- ``warm``: the second call over the same rows: per-context work only (rt_utils' CachedEncoder
  now hits every string).

contexts/s = rows / seconds of the warm call (and of the cold one). Rounds alternate which builder
goes first; the ratio is rt_utils' median contexts/s over nested's (peers: same rows, same host,
same rounds), each round's ratio beside it. Cells per context (present, the target included) say
what each builder's contexts hold: nested's are the branches' max_length x overflow; rt_utils'
the cell budget (``--rt-set model.rt.context.max_context_cells=...`` and the other budget keys: the
nested builder refuses them).
Why: an RT user's deployment cost is dominated by context assembly (issue 41), and the two
builders assemble very different contexts; the forward pass is not timed here.

    python benchmarks/bench_rt_contexts.py [--rows 500] [--rounds 3] [--set orders.max_length=4]
        [--rt-set model.rt.context.max_context_cells=96]   # --set: both builders; --rt-set: rt_utils only

Prints a table (one row per process as it finishes), the ratio, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT_DIR = Path(__file__).resolve().parent
REPO = ROOT_DIR.parent
SPEC = ROOT_DIR / "tpch_customer_churn.yaml"
BUILDERS = ("nested", "rt_utils")
LIBRARY = "model.library=relational_transformers"


# -- the child: one builder in this process --------------------------------------------------------


def measure(spec_path: Path, builder: str, rows: int, sets: Sequence[str], spec_dir: Path | None = None) -> dict:
    """One builder over the first ``rows`` root keys: the side's encode step cold, then warm."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import numpy as np
    import torch

    from tasks.measure.clock import wall_clock
    from tasks.run.chain import Chain
    from tasks.sources.open import open_sources
    from tasks.spec import load_spec
    from tasks.stages.preprocess import preprocess
    from tasks.stages.retrieve import list_root_keys, retrieve

    overrides = [LIBRARY, f"model.rt.context.builder={builder}", *sets]
    spec = load_spec(spec_path, overrides)
    chain = Chain(spec, open_sources(spec, spec_dir or spec_path.parent), torch.device("cpu"))
    keys, _ = list_root_keys(spec, chain.sources)
    keys = np.sort(keys)[:rows]
    pre = preprocess(spec, retrieve(spec, chain.sources, keys))
    side = chain.side
    seconds = []
    for _ in range(2):
        t0 = wall_clock()
        encoded = side.encode(pre, False)
        seconds.append(wall_clock() - t0)
    contexts = encoded.payload.contexts  # type: ignore[attr-defined]
    lengths = contexts.lengths
    out: dict[str, Any] = {
        "builder": builder,
        "rows": int(contexts.count),
        "cold_s": seconds[0],
        "warm_s": seconds[1],
        "cold_contexts_per_s": contexts.count / seconds[0],
        "warm_contexts_per_s": contexts.count / seconds[1],
        "cells_mean": float(lengths.mean()),
        "cells_p50": float(np.median(lengths)),
        "cells_max": int(lengths.max()),
        "strings": int(encoded.count),
        "sets": list(sets),
    }
    if builder == "rt_utils":
        f = side.figures  # type: ignore[attr-defined]
        out |= {
            "store_s": f.store_seconds,
            "assembly_s": f.assembly_seconds,
            "cells_s": f.cells_seconds,
            "text_s": side.text.seconds,  # type: ignore[attr-defined]
            "budget_full": f.budget_full,
            "cache_hits": side.text.hits,  # type: ignore[attr-defined]
            "cache_misses": side.text.misses,  # type: ignore[attr-defined]
        }
    return out


# -- the parent: fresh processes, the ratio --------------------------------------------------------


def run_child(builder: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--builder", builder, "--rows", str(args.rows)]
    sets = [*args.set, *(args.rt_set if builder == "rt_utils" else [])]
    cmd += [x for s in sets for x in ("--set", s)] + ["--spec", str(args.spec)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child {builder} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def summarise(records: Sequence[dict]) -> dict:
    """Median contexts/s per builder, the ratio rt_utils / nested (warm and cold), per-round ratios."""
    by: dict[str, list[dict]] = {b: [r for r in records if r["builder"] == b] for b in BUILDERS}
    if not all(by.values()):
        return {}

    def med(b: str, key: str) -> float:
        return float(statistics.median(r[key] for r in by[b]))

    rounds = min(len(v) for v in by.values())
    return {
        "warm_contexts_per_s": {b: med(b, "warm_contexts_per_s") for b in BUILDERS},
        "cold_contexts_per_s": {b: med(b, "cold_contexts_per_s") for b in BUILDERS},
        "warm_ratio": med("rt_utils", "warm_contexts_per_s") / med("nested", "warm_contexts_per_s"),
        "cold_ratio": med("rt_utils", "cold_contexts_per_s") / med("nested", "cold_contexts_per_s"),
        "round_warm_ratios": [
            by["rt_utils"][i]["warm_contexts_per_s"] / by["nested"][i]["warm_contexts_per_s"] for i in range(rounds)
        ],
        "cells_mean": {b: med(b, "cells_mean") for b in BUILDERS},
    }


HEADER = (
    f"{'builder':<9} {'rows':>6} {'cold s':>8} {'warm s':>8} {'warm ctx/s':>11} {'cells mean':>10} {'p50':>5} "
    f"{'max':>5}"
)


def table_line(r: dict) -> str:
    return (
        f"{r['builder']:<9} {r['rows']:>6,} {r['cold_s']:>8.2f} {r['warm_s']:>8.2f} "
        f"{r['warm_contexts_per_s']:>11,.1f} {r['cells_mean']:>10.1f} {r['cells_p50']:>5.0f} {r['cells_max']:>5}"
    )


def ratio_line(s: dict) -> str:
    if not s:
        return "ratio: needs both builders"
    rounds = ", ".join(f"{x:.3f}x" for x in s["round_warm_ratios"])
    return (
        f"rt_utils / nested contexts/s: warm {s['warm_ratio']:.3f}x (rounds {rounds}), cold {s['cold_ratio']:.3f}x; "
        f"cells per context {s['cells_mean']['rt_utils']:.1f} vs {s['cells_mean']['nested']:.1f}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=500, help="root keys (the first, sorted)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--set", action="append", default=[], help="spec overrides for both builders")
    p.add_argument(
        "--rt-set", action="append", default=[], help="overrides for rt_utils only (model.rt.context.*: its budget)"
    )
    p.add_argument("--spec", type=Path, default=SPEC)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--builder", choices=BUILDERS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.spec, args.builder, args.rows, args.set)))
        return
    print(HEADER, flush=True)
    records = []
    for i in range(args.rounds):
        for builder in BUILDERS if i % 2 == 0 else BUILDERS[::-1]:
            rec = run_child(builder, args)
            records.append(rec)
            print(table_line(rec), flush=True)
    s = summarise(records)
    print(ratio_line(s))
    out = {"bench": "rt_contexts", "rows": args.rows, "sets": args.set, "rt_sets": args.rt_set}
    print(json.dumps(out | {"summary": s, "records": records}))


if __name__ == "__main__":
    main()
