"""Runs left RUNNING by a killed process are ended KILLED by the next invocation on the host;
live runs (this process's) are left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from tasks.runtime import liveness
from tasks.tracking.stale_runs import end_stale_runs
from tasks.tracking.writer import Tracker
from tests.repo import REPO


def test_process_tags_identify_this_process():
    tags = liveness.process_tags()
    assert tags["relflow.pid"] == str(os.getpid())
    assert liveness.is_alive(tags)
    assert not liveness.is_alive({**tags, "relflow.pid_start_unix_s": "1.0"})  # a reused pid
    assert not liveness.is_alive({**tags, "relflow.boot_id": "another-boot"})


@pytest.mark.slow
def test_sigkilled_run_is_found_stale_and_ended_killed(mlflow_uri):
    code = (
        "import os, signal\nfrom tasks.tracking.writer import Tracker\n"
        "t = Tracker('stale')\nprint(t.start('doomed', {}), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL
    dead = proc.stdout.strip()
    live = Tracker("stale").start("alive", {})
    client = MlflowClient(tracking_uri=mlflow_uri)
    assert client.get_run(dead).info.status == "RUNNING"

    assert end_stale_runs(mlflow_uri) == [dead]
    run = client.get_run(dead)
    assert run.info.status == "KILLED"
    assert run.data.tags["relflow.found_stale"] == "true"
    assert "SIGKILL or out-of-memory" in run.data.tags["relflow.error"]
    assert client.get_run(live).info.status == "RUNNING"
    assert end_stale_runs(mlflow_uri) == []
