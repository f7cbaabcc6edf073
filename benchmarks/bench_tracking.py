"""Concurrent logging: does a tracking store keep every run when N benchmark processes log at once?

A team shares one MLflow. This starts ``--processes`` fresh processes at the same moment
(a barrier file), each logging ``--runs`` runs exactly the way a benchmark run does through
``tasks.tracking.writer.Tracker``: create the run, the flattened spec as params (batches of 100),
``spec.yaml``, the contract metrics in one batch, the fingerprint tags, ``stages.json``,
FINISHED. Afterwards it reads the store back and counts, per store URI:

- ``errors``: calls that raised (e.g. SQLite's "database is locked"), with the first message;
- ``lost``: runs a process started that are not FINISHED with every contract metric and
  both artifacts (a run left RUNNING counts here);
- ``runs_per_s``: FINISHED runs / wall seconds of the whole burst (all processes).

    python benchmarks/bench_tracking.py --uri http://127.0.0.1:5000 --uri sqlite:////tmp/t/mlflow.db \
        --processes 4 --runs 10

Loopback only: pass a server on 127.0.0.1 (see README "Beyond one machine"). Prints a table,
then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tasks.measure import keys as K  # noqa: E402 - after the sys.path line above

CONTRACT_METRICS = [
    *(f(s, phase) for phase in K.PHASES for s in K.PHASE_STAGES[phase] for f in (K.stage_seconds, K.stage_rows_per_s)),
    K.E2E_PREDICT_SECONDS,
    K.E2E_PREDICT_ROWS_PER_S,
    K.E2E_TRAIN_SECONDS,
    K.E2E_TRAIN_ROWS_PER_S,
    K.FIRST_CALL_SECONDS,
    K.STEADY_ROWS_PER_S,
    K.TRAIN_STEADY_ROWS_PER_S,
    K.quality("accuracy"),
    K.HOST_PEAK_BYTES,
    K.HARNESS_STARTUP_SECONDS,
]
ARTIFACTS = {"spec.yaml", "stages.json"}


def _one_process(uri: str, experiment: str, runs: int, barrier: str, tag: str, out: str) -> None:
    os.environ["MLFLOW_TRACKING_URI"] = uri
    from tasks.measure.clock import wall_clock
    from tasks.spec import load_spec
    from tasks.tracking.writer import Tracker, flatten

    spec = load_spec(ROOT / "benchmarks" / "tpch_orders.yaml")
    params = flatten(spec.to_dict())
    Path(f"{out}.ready").touch()
    while not Path(barrier).exists():  # every process starts logging at the same moment
        time.sleep(0.01)
    started, errors = [], []
    t0 = wall_clock()
    for i in range(runs):
        try:
            tracker = Tracker(experiment, uri)
            started.append(tracker.start(f"load-{tag}-{i}", {"relflow.load_test": tag}))
            tracker.log_params(params)
            tracker.log_text(spec.to_yaml(), "spec.yaml")
            tracker.log_metrics({k: float(i + 1) for k in CONTRACT_METRICS})
            tracker.set_tags({"relflow.validity": "VALID", "relflow.spec_hash": spec.spec_hash})
            tracker.log_dict([{"stage": "compute", "seconds": 1.0}], "stages.json")
            tracker.finish()
        except Exception as err:  # noqa: BLE001 - counting what a team would hit is the point
            errors.append(f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
    Path(out).write_text(json.dumps({"started": started, "errors": errors, "seconds": wall_clock() - t0}))


def measure(uri: str, processes: int, runs: int) -> dict:
    from tasks.measure.clock import wall_clock
    from tasks.tracking.reader import artifact_paths, search_runs
    from tasks.tracking.writer import Tracker

    experiment = f"load-test-{uuid.uuid4().hex[:8]}"
    Tracker(experiment, uri)  # the experiment exists before the burst, as in a team's store
    work = Path(tempfile.mkdtemp(prefix="bench-tracking-"))
    barrier = work / "go"
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_one_process, args=(uri, experiment, runs, str(barrier), f"p{j}", str(work / f"p{j}.json")))
        for j in range(processes)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 300
    while not all((work / f"p{j}.json.ready").exists() for j in range(processes)):
        if time.monotonic() > deadline or any(p.exitcode not in (None, 0) for p in procs):
            raise RuntimeError("a load-test process did not reach the start line")
        time.sleep(0.1)
    t0 = wall_clock()
    barrier.touch()
    for p in procs:
        p.join()
    wall = wall_clock() - t0
    reports = [
        json.loads((work / f"p{j}.json").read_text()) for j in range(processes) if (work / f"p{j}.json").exists()
    ]
    started = [r for rep in reports for r in rep["started"]]
    errors = [e for rep in reports for e in rep["errors"]]
    complete = 0
    by_id = {r.run_id: r for r in search_runs(experiment, status=None, uri=uri)}
    for run_id in started:
        rec = by_id.get(run_id)
        if rec is None or rec.status != "FINISHED" or any(k not in rec.metrics for k in CONTRACT_METRICS):
            continue
        if artifact_paths(run_id, uri) >= ARTIFACTS:
            complete += 1
    expected = processes * runs
    return {
        "store": "sqlite" if uri.startswith("sqlite") else "server",
        "uri": uri,
        "processes": processes,
        "runs_expected": expected,
        "runs_started": len(started),
        "runs_complete": complete,
        "lost": expected - complete,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "process_exit_codes": [p.exitcode for p in procs],
        "wall_seconds": wall,
        "runs_per_s": complete / wall if wall > 0 else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uri", action="append", required=True, help="tracking URI (repeatable)")
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--runs", type=int, default=10, help="runs each process logs")
    args = ap.parse_args()
    for uri in args.uri:
        if uri.startswith("http") and not uri.split("//", 1)[1].startswith(("127.0.0.1", "localhost")):
            sys.exit(f"{uri}: this load test runs on loopback only (127.0.0.1)")
    results = [measure(uri, args.processes, args.runs) for uri in args.uri]
    print(
        f"{'store':8} {'procs':>5} {'runs':>5} {'complete':>8} {'lost':>5} {'errors':>6} {'wall s':>7} "
        f"{'runs/s':>7}  first error"
    )
    for r in results:
        print(
            f"{r['store']:8} {r['processes']:>5} {r['runs_expected']:>5} {r['runs_complete']:>8} {r['lost']:>5} "
            f"{r['errors']:>6} {r['wall_seconds']:>7.1f} {r['runs_per_s']:>7.2f}  {r['first_error'] or '-'}"
        )
    print(f"load per core at the end: {os.getloadavg()[0] / (os.cpu_count() or 1):.2f}")
    print(json.dumps({"bench": "tracking", "results": results}))


if __name__ == "__main__":
    main()
