"""Scheduled benchmarks end to end with the real tools: ``prefect server start`` on a free
loopback port, ``relflow-bench serve`` (creates the process work pool and the deployment,
cron from the spec file), ``prefect worker start``, ``prefect deployment run``, and a FINISHED
MLflow run in a temp store. The server and worker are this test's own processes (own
PREFECT_HOME and API URL) and are stopped by pid, also when the test fails.

Slow: ~15 s server start-up, ~20 s worker + flow-run process start-up, plus a small run.
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
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.repo import ANY_STEADY, REPO, TINY_RUN

DEFAULT_SPEC = REPO / "benchmarks" / "tpch_orders.yaml"
OVERRIDES = [*TINY_RUN, "run.mode=predict", "run.device=cpu", *ANY_STEADY]
POOL = "relflow-test"
CRON = "0 3 * * *"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _process(args: list[str], env: dict[str, str], log: Path, cwd: Path) -> Iterator[subprocess.Popen]:
    """Start a process in its own session; on exit stop it (and its children) by its pid."""
    with open(log, "w") as fh:
        proc = subprocess.Popen(args, env=env, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)


def _wait_until(check, deadline_s: float, what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1.0)
    tails = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
    raise AssertionError(f"timed out waiting for {what}\n{tails}")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


@pytest.mark.slow
def test_deployment_run_through_server_and_worker_lands_in_mlflow(tpch_small, tmp_path):
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri).search_experiments()  # create the store before two processes use it
    env = dict(
        os.environ,
        PREFECT_HOME=str(tmp_path / "prefect-home"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        MLFLOW_TRACKING_URI=uri,
        PREFECT_WORKER_QUERY_SECONDS="2",
        PREFECT_LOGGING_LEVEL="INFO",
    )
    env.pop("PREFECT_API_URL", None)
    client_env = dict(env, PREFECT_API_URL=api)
    raw = yaml.safe_load(DEFAULT_SPEC.read_text())
    raw["schedule"] = {"cron": CRON}
    spec = tmp_path / "nightly.yaml"
    spec.write_text(yaml.safe_dump(raw, sort_keys=False))
    server_log, worker_log = tmp_path / "server.log", tmp_path / "worker.log"
    logs = [server_log, worker_log]

    def cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=client_env, cwd=tmp_path, capture_output=True, text=True, timeout=timeout)

    with _process(
        ["prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui"], env, server_log, tmp_path
    ):
        _wait_until(lambda: _healthy(api), 180, "the Prefect server", logs)
        sets = [a for o in OVERRIDES for a in ("--set", o)]
        served = cli(sys.executable, "-m", "flows.cli", "serve", str(spec), "--pool", POOL, "--create-pool", *sets)
        assert served.returncode == 0, served.stdout + served.stderr
        deployment = f"benchmark/tpch-orders@{POOL}"
        assert deployment in served.stdout and CRON in served.stdout
        inspected = cli("prefect", "deployment", "inspect", deployment)
        assert inspected.returncode == 0 and CRON in inspected.stdout, inspected.stdout + inspected.stderr

        with _process(
            ["prefect", "worker", "start", "--pool", POOL, "--type", "process", "--limit", "1"],
            client_env,
            worker_log,
            tmp_path,
        ):
            triggered = cli("prefect", "deployment", "run", deployment)
            assert triggered.returncode == 0, triggered.stdout + triggered.stderr
            client = MlflowClient(tracking_uri=uri)

            def finished() -> bool:
                exp = client.get_experiment_by_name("tpch-orders")
                runs = client.search_runs([exp.experiment_id]) if exp else []
                if any(r.info.status == "FAILED" for r in runs):
                    raise AssertionError(
                        f"the deployed run FAILED: {runs[0].data.tags.get('relflow.error')}\n"
                        f"{worker_log.read_text()[-3000:]}"
                    )
                return any(r.info.status == "FINISHED" for r in runs)

            _wait_until(finished, 480, "a FINISHED MLflow run from the deployment", logs)

    exp = MlflowClient(tracking_uri=uri).get_experiment_by_name("tpch-orders")
    (run,) = MlflowClient(tracking_uri=uri).search_runs([exp.experiment_id])
    assert run.data.tags["relflow.deployment"] == deployment
    assert run.data.tags["relflow.pool"] == POOL
    assert run.data.params["run.batch_size"] == "2048"  # the --set overrides were deployed
    assert (tmp_path / "outputs").is_dir()  # the flow ran in the deployment's working directory
