"""Real benchmark runs for the report tests, made once per session.

Three runs of the default TPC-H workload at scale 0.002 (3,000 orders, generated once into the
session's data folder: the report tests need real runs, not many rows) with a tiny model and
``run.repeats=4`` (each run logs a repeat median over passes 1-3), through the real
``benchmark`` flow under the session's Prefect harness, into one temp MLflow store:
batch size 512 twice (same configuration) and batch size 16 once.

``run.mode=predict`` (untrained weights, a pure speed run): the comparison is about
throughput, and training at batch size 16 costs minutes on a shared 2-core machine without
adding anything to it. Slow: Prefect start-up plus three runs. One more, single_stream, for
the trace view (``trace_run``), and ``relflow-bench ui`` on a free loopback port over either
store (``running_ui``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.repo import ANY_STEADY, REPO, SMALL_RUN

DEFAULT_SPEC = REPO / "benchmarks" / "tpch_orders.yaml"
OVERRIDES = [
    *SMALL_RUN,  # every run below sets its own run.batch_size
    "run.packing=off",
    "run.repeats=4",
    "run.mode=predict",
    *ANY_STEADY,  # 3,000 orders: 6 batches of 512 a pass, 2 of them warm-up
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
            spec = load_spec(DEFAULT_SPEC, [*OVERRIDES, f"run.batch_size={batch}"])
            ids.append(
                benchmark(
                    spec=spec.to_dict(), spec_dir=str(DEFAULT_SPEC.parent), tags={"relflow.test_batch": str(batch)}
                )["run_id"]
            )
    return BenchRuns(uri, folder, *ids)


@dataclass
class TraceRun:
    uri: str
    folder: Path
    run_id: str


@pytest.fixture(scope="session")
def trace_run(prefect_harness, tmp_path_factory) -> TraceRun:
    """One short single_stream run of the same small workload (64 requests, LoadGen's fewest
    for the p90 rule) in its own store, for the trace view."""
    from flows.benchmark import benchmark
    from tasks.spec import load_spec

    folder = tmp_path_factory.mktemp("traces")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    requests = [
        "run.scenario=single_stream",
        "run.request.min_requests=64",
        "run.request.min_duration_s=0",
        "run.request.roots=2",
        "run.repeats=1",
        "run.batch_size=512",
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        spec = load_spec(DEFAULT_SPEC, [*OVERRIDES, *requests])
        run_id = benchmark(spec=spec.to_dict(), spec_dir=str(DEFAULT_SPEC.parent))["run_id"]
    return TraceRun(uri, folder, run_id)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_ui(uri: str, folder: Path, log: Path) -> Iterator[tuple[str, str]]:
    """``relflow-bench ui`` over ``uri`` on a free port of 127.0.0.1; yields (base URL, what it
    printed); stopped by SIGTERM (the command stops the MLflow server it started)."""
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "ui", "--port", str(port)],
            cwd=folder,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # a busy 2-core machine takes a minute to start it
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"relflow-bench ui did not come up:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield base, log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def start_ui():
    """``running_ui`` for test modules (tests/ is not a package)."""
    return running_ui


@pytest.fixture(scope="module")
def mlflow_ui(bench_runs, tmp_path_factory) -> Iterator[tuple[str, str]]:
    """The UI over the session's three benchmark runs."""
    with running_ui(bench_runs.uri, bench_runs.folder, tmp_path_factory.mktemp("ui") / "ui.out") as ui:
        yield ui
