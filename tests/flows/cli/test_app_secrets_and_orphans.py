"""Two promises of a real ``relflow-bench run`` process (issue 24).

- A secret in the tracking URI (here a ``token`` query parameter of the SQLite store's URI,
  which MLflow accepts and ignores) appears in no output stream, no file the run wrote (the
  ``--json`` summary, MLflow's store and artifacts, Prefect's database with the run's
  artifact) and no MLflow param, tag or metric: every place shows the masked URI.
- SIGKILL of the CLI leaves no child behind: Prefect's temporary server used to stay alive
  as an orphan (tasks/runtime/watchdog.py).

Named ``test_app_secrets_and_orphans.py`` (tests/README.md): test_app.py holds the app's own tests;
this file is one aspect of ``run`` (flows/cli/app.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow  # real CLI runs with their own Prefect server

SECRET = "s3cretQ7zz"
PREFECT_SERVER = "prefect.server.api.server:create_app"


def _workload(folder: Path, shop_kit) -> Path:
    data = folder / "data"
    data.mkdir(parents=True)
    spec = shop_kit.spec()
    spec["run"]["mode"] = "predict"  # the shop has no validation rows at the default split
    for name, table in shop_kit.tables().items():
        shop_kit.write_table(table, data / f"{name}.parquet")
    (data / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return data / "spec.yaml"


def _env(folder: Path, uri: str) -> dict[str, str]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PREFECT_HOME": str(folder / "prefect-home"), "COLUMNS": "100"}
    env.pop("PREFECT_API_URL", None)
    return env


def test_secret_in_the_tracking_uri_is_shown_and_stored_nowhere(tmp_path, shop_kit):
    spec = _workload(tmp_path, shop_kit)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}?token={SECRET}"
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", str(spec), "--json", str(tmp_path / "summary.json")],
        cwd=tmp_path,
        env=_env(tmp_path, uri),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert SECRET not in proc.stdout and SECRET not in proc.stderr
    assert "token=***" in proc.stdout  # the summary names the store, masked
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tracking_uri"].endswith("?token=***")
    leaked = [p for p in tmp_path.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not leaked, leaked
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(summary["run_id"])
    fields = json.dumps([run.data.params, run.data.tags, list(run.data.metrics), run.info.artifact_uri])
    assert SECRET not in fields


def test_sigkill_of_the_cli_leaves_no_child_process(tmp_path, shop_kit):
    spec = _workload(tmp_path, shop_kit)
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", str(spec)],
        cwd=tmp_path,
        env=_env(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    cli = psutil.Process(proc.pid)
    deadline = time.monotonic() + 300
    children: list[psutil.Process] = []
    while not any(PREFECT_SERVER in " ".join(c.cmdline()) for c in children if c.is_running()):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before Prefect's server started"
        time.sleep(0.05)
        try:
            children = cli.children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
    children = cli.children(recursive=True)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    _, alive = psutil.wait_procs(children, timeout=10)  # the watcher is woken at once; 5 s grace for SIGTERM
    try:
        assert not alive, [" ".join(p.cmdline())[:120] for p in alive]
    finally:
        for p in alive:
            p.kill()
