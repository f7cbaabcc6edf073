"""Real benchmark runs for the report tests, made once per session.

Three runs of the default TPC-H workload at scale 0.002 (3,000 orders, generated once into the
session's data folder: the report tests need real runs, not many rows) with a tiny model and
``run.repeats=4`` (each run logs a repeat median over passes 1-3), through the real
``benchmark`` flow under the session's Prefect harness, into one temp MLflow store:
batch size 512 twice (same configuration) and batch size 16 once.

``run.mode=predict`` (untrained weights, a pure speed run): the comparison is about
throughput, and training at batch size 16 costs minutes on a shared 2-core machine without
adding anything to it. Slow: Prefect start-up plus three runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SPEC = REPO / "benchmarks" / "tpch_orders.yaml"
SMALL = [
    "model.d_model=16",
    "model.layers=1",
    "model.heads=2",
    "run.epochs=1",
    "run.device=cpu",
    "run.packing=off",
    "run.repeats=4",
    "run.mode=predict",
    "run.min_steady_seconds=0.000001",
    "run.min_steady_batches=1",  # 3,000 orders: 6 batches of 512 a pass, 2 of them warm-up
    "source.generate.tpch.scale=0.002",
    # these runs feed report plumbing, not figures: a test host busy with other tests must not
    # make them INVALID (history and the dashboard's history chart leave INVALID runs out)
    "run.max_host_load=1.0",
]


@dataclass
class BenchRuns:
    uri: str
    folder: Path
    a_512: str
    b_512: str
    c_16: str


@pytest.fixture(scope="session")
def bench_runs(prefect_harness, tmp_path_factory) -> BenchRuns:
    from flows.benchmark import benchmark
    from tasks.spec import load_spec

    folder = tmp_path_factory.mktemp("reports")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    ids = []
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        for batch in (512, 512, 16):
            spec = load_spec(DEFAULT_SPEC, [*SMALL, f"run.batch_size={batch}"])
            ids.append(
                benchmark(
                    spec=spec.to_dict(), spec_dir=str(DEFAULT_SPEC.parent), tags={"relflow.test_batch": str(batch)}
                )["run_id"]
            )
    return BenchRuns(uri, folder, *ids)
