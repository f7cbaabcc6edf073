"""Cross-check and footprint: the harness's steady predict throughput against a bare loop.

What: steady predict rows/s of the same model (same seed, packing, batch size) on the same
pre-built batches (benchmarks/batches.py: the harness's own chain, untimed), timed by a bare
forward loop (clock module, first call + ``run.warmup_batches`` dropped, exact rows / summed
step seconds), in fresh processes interleaved over --rounds (order rotated each round):

- ``bare``: the loop and nothing else in the process (the batches built once, in a process
  of their own, and loaded);
- the loop with one of the harness's side activities switched on: ``memory`` (the harness's
  default ``PeakMemory`` sampler, tasks/measure/memory.py), ``tree20`` (a 20 ms psutil walk of
  the process tree reading every child's RSS: the sampler before issue 20), ``cpu`` (the
  ``OtherCpu`` bracket and the 0.5 s idle window before it, tasks/measure/hostload.py),
  ``sysmetrics`` (MLflow's system-metric collectors at the spec's default interval,
  tasks/tracking/writer.py ``SystemSampler``), ``prefect`` (the loop inside a Prefect flow run
  against Prefect's temporary server, a child process), ``mlflow`` (an MLflow run open on a
  local SQLite store);
- ``harness``: ``relflow-bench run --set run.mode=predict`` with every other default, its
  ``compute.steady_rows_per_s``.

Each variant's cost is the median over rounds of ``bare / variant`` (a round's pair shares
the host's state; >1 means slower than bare) with its order-statistic 95% interval
(tasks/measure/report.py ``ratio_interval``; from 6 rounds). Goal: the harness within 3% of
the bare loop.
Why: a harness can add overhead of its own (Prefect, tracking threads, memory sampling) or
measure a different thing than a user's own loop.

    python benchmarks/bench_crosscheck.py --rounds 6 [--variants bare,memory,harness] [--passes 2]
    python benchmarks/bench_crosscheck.py --ticks   # CPU cost of one memory-sampler tick, old vs new

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
sys.path.insert(0, str(REPO))  # this checkout's tasks/, not an installed copy's

from tasks.measure import keys as K  # noqa: E402
from tasks.measure.report import interval_text, ratio_interval  # noqa: E402
from tasks.measure.stats import median_interval  # noqa: E402

VARIANTS = ("bare", "memory", "tree20", "cpu", "sysmetrics", "prefect", "mlflow", "harness")
GOAL = 0.03  # the harness's steady figure within 3% of the bare loop


def forward_loop(parts, model, skip: int, passes: int) -> float:
    """Steady rows/s of ``passes`` passes over ``parts`` (first call + warm-up dropped once)."""
    import torch

    from tasks.measure.clock import Clock

    clock = Clock("cpu")
    seconds, rows, i = 0.0, 0, 0
    with torch.no_grad():
        for _ in range(passes):
            for part in parts:
                with clock.measure() as span:
                    outs = model(part, outputs=("prediction",))
                    {k: v.float().to("cpu") for k, v in outs.items()}
                if i >= skip:
                    seconds, rows = seconds + span.seconds, rows + part.size
                i += 1
    return rows / seconds


@contextlib.contextmanager
def tree_walk_20ms() -> Iterator[None]:
    """The memory sampler before issue 20: every 20 ms, list the whole process tree through
    /proc and read each member's RSS."""
    import psutil

    stop = threading.Event()
    proc = psutil.Process()
    peak = [0]

    def loop() -> None:
        while not stop.wait(0.02):
            total = proc.memory_info().rss
            for c in proc.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    total += c.memory_info().rss
            peak[0] = max(peak[0], total)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


@contextlib.contextmanager
def side_activity(variant: str, spec, folder: Path) -> Iterator[None]:
    if variant == "bare":
        yield
    elif variant == "memory":
        from tasks.measure.memory import PeakMemory

        mem = PeakMemory().start()
        try:
            yield
        finally:
            mem.stop()
    elif variant == "tree20":
        with tree_walk_20ms():
            yield
    elif variant == "cpu":
        from tasks.measure.hostload import OtherCpu, other_cpu_fraction_before

        other_cpu_fraction_before()
        other = OtherCpu().start()
        try:
            yield
        finally:
            other.stop()
    elif variant == "sysmetrics":
        from tasks.tracking.writer import SystemSampler

        sampler = SystemSampler(spec.run.system_metrics_interval_s, f"sqlite:///{folder / 'mlflow.db'}")
        sampler.start()
        try:
            yield
        finally:
            sampler.stop()
    elif variant == "mlflow":
        from tasks.tracking.writer import Tracker  # tasks/tracking: the one package that talks to MLflow

        tracker = Tracker("crosscheck", f"sqlite:///{folder / 'mlflow.db'}")
        tracker.start(run_name="crosscheck-mlflow", tags={})
        try:
            yield
        finally:
            tracker.finish()
    else:
        raise ValueError(f"no side activity {variant!r}")


def build(spec_path: Path, out: Path) -> None:
    """Every root row's predict batches, through the harness's chain, saved once for all children."""
    import torch

    sys.path.insert(0, str(ROOT))
    from batches import load

    _, schema, parts = load(spec_path, ["run.mode=predict"])
    torch.save({"schema": schema, "parts": parts}, out)


def tick_costs(n: int = 200) -> dict[str, float]:
    """CPU milliseconds one tick of each memory sampler costs in this process (thread CPU
    time: what the tick takes from the cores, whatever the host's load does to wall time)."""
    import time

    import psutil

    from tasks.measure.memory import PeakMemory

    proc = psutil.Process()

    def tree20_tick() -> None:
        total = proc.memory_info().rss
        for c in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += c.memory_info().rss

    mem = PeakMemory()
    mem.start()
    mem.stop()
    out = {}
    for name, tick in (("tree20", tree20_tick), ("memory", mem._sample)):
        t0 = time.thread_time()
        for _ in range(n):
            tick()
        out[name] = (time.thread_time() - t0) / n * 1e3
    return out


def loaded(spec_path: Path, batches: Path):
    """(spec, parts, model) of a bare-loop child: the predict spec, the batches build() saved
    and the harness's own model for them."""
    import torch

    sys.path.insert(0, str(ROOT))
    from batches import build_model

    from tasks.spec import load_spec

    spec = load_spec(spec_path, ["run.mode=predict"])
    saved = torch.load(batches, weights_only=False)  # our own file, written by build()
    return spec, saved["parts"], build_model(spec, saved["schema"])


def child(variant: str, spec_path: Path, threads: int | None, passes: int, batches: Path) -> float:
    import torch

    if threads:
        torch.set_num_threads(threads)
    spec, parts, model = loaded(spec_path, batches)
    skip = 1 + spec.run.warmup_batches
    with tempfile.TemporaryDirectory(prefix="relflow-footprint-") as d:
        if variant == "prefect":
            # Without PREFECT_API_URL a flow run starts Prefect's temporary server (a child
            # process) and reports its states to it, as a standalone `relflow-bench run` does.
            os.environ.pop("PREFECT_API_URL", None)
            from prefect import flow

            @flow(name="footprint-loop", log_prints=False)
            def in_flow() -> float:
                return forward_loop(parts, model, skip, passes)

            return float(in_flow())
        with side_activity(variant, spec, Path(d)):
            return forward_loop(parts, model, skip, passes)


def checkout_env() -> dict[str, str]:
    """The environment of every child: this checkout's code first, whatever is installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def harness(spec_path: Path, threads: int | None, folder: Path) -> float:
    out = folder / "summary.json"
    sets = ["run.mode=predict"]
    if threads:
        sets.append(f"run.threads.intra_op={threads}")
    cmd = [sys.executable, "-m", "flows.cli", "run", str(spec_path), "--json", str(out)]
    for s in sets:
        cmd += ["--set", s]
    env = {**checkout_env(), "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}"}
    env.pop("PREFECT_API_URL", None)  # a standalone run: its own temporary server
    subprocess.run(cmd, cwd=folder, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.read_text())["metrics"][K.STEADY_ROWS_PER_S]


def measure(variant: str, spec: Path, threads: int, passes: int, batches: Path) -> float:
    if variant == "harness":
        with tempfile.TemporaryDirectory(prefix="relflow-xcheck-") as d:
            return harness(spec, threads or None, Path(d))
    cmd = [sys.executable, __file__, "--spec", str(spec), "--threads", str(threads), "--passes", str(passes)]
    cmd += ["--batches", str(batches)]
    env = checkout_env()
    # A loaded host starts Prefect's temporary server slowly; its default 20 s wait then fails.
    env.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    proc = subprocess.run([*cmd, "--child", variant], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        print(f"  {variant} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}", file=sys.stderr)
        return math.nan  # the round's pair is dropped for this variant, the others go on
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["rows_per_s"])


def rounds(variants: list[str], n: int, run: Callable[[str], float]) -> dict[str, dict[int, float]]:
    """variant -> round -> rows/s, each round in a rotated order (drift hits all alike)."""
    out: dict[str, dict[int, float]] = {v: {} for v in variants}
    for r in range(n):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for v in order:
            if math.isnan(got := run(v)):
                continue
            out[v][r] = got
            print(f"  round {r + 1} {v:<11} {out[v][r]:>9,.0f} rows/s", file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=ROOT / "tpch_orders.yaml")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from {', '.join(VARIANTS)}")
    ap.add_argument("--passes", type=int, default=1, help="passes over the batches in each bare-loop process")
    ap.add_argument("--threads", type=int, default=0, help="set torch threads in all (0 = leave unset)")
    ap.add_argument("--ticks", action="store_true", help="only the CPU cost of one memory-sampler tick, old vs new")
    ap.add_argument("--child", choices=VARIANTS[:-1], help=argparse.SUPPRESS)
    ap.add_argument("--batches", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--build", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    spec = args.spec.resolve()
    if args.ticks:
        import psutil

        ms = tick_costs()
        print(f"memory sampler, CPU per tick ({len(psutil.pids())} processes on the host):")
        print(f"  tree20 (20 ms walk of all /proc): {ms['tree20']:.3f} ms = {ms['tree20'] * 50 / 10:.1f}% of a core")
        print(f"  memory (own tree, VmHWM; 1 s without children, 0.1 s with): {ms['memory']:.3f} ms")
        print(json.dumps({"bench": "crosscheck-ticks", "cpu_ms_per_tick": ms}))
        return
    if args.build:
        build(spec, args.build)
        return
    if args.child:
        rows_per_s = child(args.child, spec, args.threads or None, args.passes, args.batches)
        print(json.dumps({"rows_per_s": rows_per_s}))
        return
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or "bare" not in variants:
        sys.exit(
            f"--variants: {', '.join(unknown) or 'bare is missing'}; choose from {', '.join(VARIANTS)} (bare required)"
        )
    with tempfile.TemporaryDirectory(prefix="relflow-footprint-") as tmp:
        batches = Path(tmp) / "batches.pt"
        # Built once, in a fresh process: every bare-loop child times the same batches, and
        # spends its seconds on the loop, not on rebuilding them.
        subprocess.run(
            [sys.executable, __file__, "--spec", str(spec), "--build", str(batches)], check=True, env=checkout_env()
        )
        load_before = os.getloadavg()
        got = rounds(variants, args.rounds, lambda v: measure(v, spec, args.threads, args.passes, batches))
    load_after = os.getloadavg()
    bare = got["bare"]
    print(
        f"{spec.name}: predict steady rows/s, {args.rounds} interleaved rounds, fresh processes, threads "
        f"{args.threads or 'unset'}, load (1/5/15 min) before {load_before[0]:.2f}/{load_before[1]:.2f}/"
        f"{load_before[2]:.2f}, after {load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f}"
    )
    print(f"{'variant':<11} {'median rows/s':>13}  {'cost bare/variant':>17}  {'95% CI':>16}  rounds")
    table = {}
    for v in variants:
        med = median_interval(list(got[v].values())).median
        ri = ratio_interval(bare, got[v]) if v != "bare" else None
        cost = f"{ri.median:.3f}" if ri else "1"
        ci = interval_text(ri.low, ri.high, ri.n, ".3f") if ri else ""
        print(f"{v:<11} {med:>13,.0f}  {cost:>17}  {ci:>16}  {', '.join(f'{x:,.0f}' for x in got[v].values())}")
        table[v] = {
            "rows_per_s": list(got[v].values()),
            "median": med,
            "cost": ri.median if ri else 1.0,
            "ci_low": ri.low if ri else None,
            "ci_high": ri.high if ri else None,
        }
    goal_met = None
    if "harness" in table:
        goal_met = abs(table["harness"]["cost"] - 1) <= GOAL
        print(
            f"harness cost {table['harness']['cost']:.3f} (goal within {GOAL:.0%}: {'met' if goal_met else 'missed'})"
        )
    print(
        json.dumps(
            {
                "bench": "crosscheck",
                "spec": spec.name,
                "rounds": args.rounds,
                "load_before": load_before,
                "load_after": load_after,
                "variants": table,
                "goal_met": goal_met,
            }
        )
    )


if __name__ == "__main__":
    main()
