"""Run lifecycle through the real CLI: SIGTERM ends the MLflow run (never RUNNING) without
leaving outputs, and two concurrent runs never overlap their timed regions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

SMALL = [
    "--set",
    "model.d_model=16",
    "--set",
    "model.heads=2",
    "--set",
    "run.batch_size=512",
    "--set",
    "run.min_steady_seconds=0",
    "--set",
    "run.min_steady_batches=0",
]


def _cli(args: list[str], cwd: Path, uri: str, **kw) -> subprocess.Popen:
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri)
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _runs(uri: str):
    client = MlflowClient(tracking_uri=uri)
    exps = client.search_experiments()
    return client.search_runs([e.experiment_id for e in exps]) if exps else []


@pytest.mark.slow
def test_sigterm_ends_run_killed_and_leaves_no_outputs(tpch_small, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # Long enough to be caught mid-training: many epochs of a small model.
    proc = _cli([*SMALL, "--set", "run.epochs=200"], tmp_path, uri)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if any(r.info.status == "RUNNING" for r in _runs(uri)):
            break
        time.sleep(0.5)
    assert proc.poll() is None, f"run ended before it could be interrupted: {proc.communicate()}"
    time.sleep(2)  # inside the stages now
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    runs = _runs(uri)
    assert len(runs) == 1
    assert runs[0].info.status in {"KILLED", "FAILED"}, runs[0].info.status
    outputs = tmp_path / "outputs"
    leftovers = list(outputs.rglob("*")) if outputs.exists() else []
    assert not [p for p in leftovers if p.suffix == ".parquet" or ".tmp-" in p.name], leftovers
    assert "Traceback" not in err


@pytest.mark.slow
def test_concurrent_runs_never_overlap_timed_regions(tpch_small, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # Create the store first so the two processes do not race on its migrations.
    MlflowClient(tracking_uri=uri).search_experiments()
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        d.mkdir()
    procs = [_cli([*SMALL, "--set", "run.epochs=2"], d, uri) for d in dirs]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    runs = _runs(uri)
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)
    spans = sorted(
        (r.data.metrics["harness.timed_region_start_unix_s"], r.data.metrics["harness.timed_region_end_unix_s"])
        for r in runs
    )
    assert spans[0][1] <= spans[1][0], f"timed regions overlap: {spans}"
    # Both record how long they waited for the host (0 for whichever came first); whether
    # the second one had to wait depends on start-up jitter, so only non-overlap is asserted.
    assert all(r.data.metrics["harness.lock_wait_seconds"] >= 0 for r in runs)
