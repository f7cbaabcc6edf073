"""What knowing the price costs inside the timed loop (issue 41 item 5), per steady batch.

What: the work the progress count and the run's projection add to the compute stage, against a
steady predict batch of the spec's model over its real rows:

- ``hook``: ``EngineBase.after_batch`` -> ``Pricing.after_batch`` once the phase is priced (a
  counter, ``progress.tick``: two integer additions when someone listens, a None check when no one
  does), per batch, timed over many calls;
- ``projection``: one ``Pricing.project`` (made at most once per phase), with a no-op listener,
  and the projection event through ``run``'s own listener (which starts a thread to print it);
- ``redraw``: one redraw of ``run``'s progress line (spinner, description, count, elapsed) to a
  terminal console on /dev/null, the work its refresh thread does ``REFRESH_PER_S`` times a
  second off the loop's thread: x that rate, the share of one core it takes;
- ``display``: the steady batch's median with that line live, and with the line ``run`` drew
  before the counts (a spinner, Rich's 10 redraws a second), over the median with no display,
  interleaved over ``--rounds`` (on a loaded 2-core host these ratios carry the host's noise).

Why: the display must not add work inside timed regions; every second of the region belongs to
one named bucket, and these seconds fall inside ``compute`` (the hook runs between batches,
outside each batch's span, so ``compute.batch_ms.*`` are untouched).
How: the harness's own chain and engine, untimed preparation, the default workload's first
``--roots`` root rows at TPC-H scale 0.01 (``relflow-bench data tpch --scale 0.01`` first).

    python benchmarks/bench_progress.py --rounds 5

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's flows/ (the CLI's display), as bench_crosscheck does

from flows.cli.app import REFRESH_PER_S, _progress_line, _Shown, progress_bar  # noqa: E402
from tasks.measure.clock import wall_clock  # noqa: E402
from tasks.run.chain import Chain  # noqa: E402
from tasks.run.scenarios.pricing import Pricing  # noqa: E402
from tasks.run.scenarios.workload import Workload  # noqa: E402
from tasks.runtime import progress  # noqa: E402
from tasks.sources.open import open_sources  # noqa: E402
from tasks.spec import load_spec  # noqa: E402
from tasks.stages.retrieve import list_root_keys  # noqa: E402

ROOT = REPO / "benchmarks"


def per_call_seconds(call: Callable[[], object], n: int) -> float:
    """Median over 5 loops of ``n`` calls, per call."""
    times = []
    for _ in range(5):
        start = wall_clock()
        for _ in range(n):
            call()
        times.append((wall_clock() - start) / n)
    return statistics.median(times)


def redraw_seconds(count: progress.Count) -> float:
    """One redraw of ``run``'s line with an open count, as its refresh thread does it."""
    con = Console(file=open(os.devnull, "w"), force_terminal=True, width=160)  # noqa: SIM115
    shown = _Shown(count=count, began=wall_clock() - 1.0)
    bar = progress_bar(con, shown)
    bar.add_task("bench: chunk 1 compute (predict)", total=None)
    with con:
        seconds = per_call_seconds(lambda: con.print(bar.make_tasks_table(bar.tasks), end="\r"), 200)
    con.file.close()
    return seconds


def display(kind: str) -> AbstractContextManager[Any]:
    """``count``: ``run``'s line (flows/cli/app.py ``progress_bar``) drawing to /dev/null as a
    terminal; ``spinner``: the line before the counts (spinner, description, elapsed, Rich's
    10 redraws a second); ``off``: nothing."""
    if kind == "off":
        return nullcontext()
    con = Console(file=open(os.devnull, "w"), force_terminal=True, width=160)  # noqa: SIM115
    shown = _Shown()

    def listen(event: str, info: dict[str, Any]) -> None:
        if event == "count":
            shown.count, shown.began = info["count"], wall_clock()

    class Live:
        def __enter__(self) -> None:
            if kind == "count":
                self.bar = progress_bar(con, shown)
            else:
                self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=con)
            self.bar.__enter__()
            self.bar.add_task("bench: predict", total=None)
            self.unsubscribe = progress.subscribe(listen)

        def __exit__(self, *exc: object) -> None:
            self.unsubscribe()
            self.bar.__exit__(None, None, None)
            con.file.close()

    return Live()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=ROOT / "tpch_orders.yaml")
    ap.add_argument("--roots", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    args = ap.parse_args()

    spec = load_spec(args.spec, ["run.mode=predict", "run.warmup_batches=2", *args.sets])
    chain = Chain(spec, open_sources(spec, args.spec.resolve().parent), torch.device("cpu"))
    keys, _ = list_root_keys(spec, chain.sources)
    work = Workload(chain)
    work.use_keys(keys[: args.roots])
    tz = chain.prepare_untimed(keys[: args.roots])
    engine = chain.ensure_engine()
    assert engine is not None
    outputs = tuple(spec.task.outputs)
    engine.predict(tz, outputs)  # the first call and warm-up
    engine.settle()

    def steady_batch_s(kind: str) -> float:
        before = len(engine.predict_timings.steady_seconds)
        with display(kind):
            progress.begin("predict", 10**6)
            engine.predict(tz, outputs)
            progress.end()
        engine.settle()
        return statistics.median(engine.predict_timings.steady_seconds[before:])

    kinds = ("off", "spinner", "count")
    seen: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(args.rounds):  # interleaved: drift on the host touches every kind alike
        for k in kinds:
            seen[k].append(steady_batch_s(k))
    batch = statistics.median(seen["off"])
    spinner, count = statistics.median(seen["spinner"]), statistics.median(seen["count"])

    pricing = Pricing(work, chain.clock)
    pricing.priced = {"predict"}  # after the projection: the per-batch path
    hook_quiet = per_call_seconds(lambda: pricing.after_batch("predict", spec.run.batch_size), args.calls)
    unsubscribe = progress.subscribe(lambda event, info: None)
    progress.begin("predict", 10**6)
    hook_listened = per_call_seconds(lambda: pricing.after_batch("predict", spec.run.batch_size), args.calls)
    project_s = per_call_seconds(lambda: pricing.project("predict"), 200)
    unsubscribe()
    progress.end()

    # the projection event through run's own listener (it hands the print to a thread of its own)
    with open(os.devnull, "w") as sink, _progress_line("bench", Console(file=sink, force_terminal=True, width=160)):
        listener_s = per_call_seconds(lambda: progress.emit("projection", text="projected 1.0 s", seconds=1.0), 20)
    redraw = redraw_seconds(progress.Count("predict", 4096, done=1234, rows=1234 * 256))
    rows = [
        ("steady predict batch, no display (median of rounds)", batch * 1e3, "ms", 1.0),
        ("steady predict batch, the old spinner line live", spinner * 1e3, "ms", spinner / batch),
        ("steady predict batch, run's count line live", count * 1e3, "ms", count / batch),
        ("after_batch hook, no listener, per batch", hook_quiet * 1e9, "ns", hook_quiet / batch),
        ("after_batch hook, listener, per batch", hook_listened * 1e9, "ns", hook_listened / batch),
        ("one projection (once per phase)", project_s * 1e6, "us", project_s / batch),
        ("the projection event through run's listener", listener_s * 1e6, "us", listener_s / batch),
        ("one redraw of the line, off the loop's thread", redraw * 1e6, "us", redraw / batch),
        (f"redraws x {REFRESH_PER_S}/s: share of one core", redraw * REFRESH_PER_S * 100, "%", float("nan")),
    ]  # fmt: skip
    print(f"{'what':<56} {'figure':>12} {'unit':<4} {'vs batch':>10}")
    for what, fig, unit, ratio in rows:
        print(f"{what:<56} {fig:>12,.3f} {unit:<4} {ratio:>10.2e}")
    print(
        json.dumps(
            {
                "bench": "progress",
                "batch_size": spec.run.batch_size,
                "roots": args.roots,
                "rounds": args.rounds,
                "steady_batch_ms": batch * 1e3,
                "spinner_over_off": spinner / batch,
                "count_over_off": count / batch,
                "count_over_spinner_per_round": [c / s for s, c in zip(seen["spinner"], seen["count"], strict=True)],
                "hook_ns_no_listener": hook_quiet * 1e9,
                "hook_ns_listener": hook_listened * 1e9,
                "hook_over_batch": hook_listened / batch,
                "projection_us": project_s * 1e6,
                "projection_over_batch": project_s / batch,
                "projection_listener_us": listener_s * 1e6,
                "redraw_us": redraw * 1e6,
                "redraw_core_share": redraw * REFRESH_PER_S,
            }
        )
    )


if __name__ == "__main__":
    main()
