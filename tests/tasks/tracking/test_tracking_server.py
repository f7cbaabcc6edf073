"""A shared MLflow tracking server, for real: PostgreSQL backend store, proxied artifacts,
``mlflow server`` on a free loopback port, benchmark processes as its clients.

- four ``relflow-bench run`` processes (each with its own host lock: four hosts) log at once;
  every run is FINISHED with the contract metrics and artifacts, and compare, history and
  dashboard read them back through the server;
- the concurrent-logging load test (``benchmarks/bench_tracking.py``) against the server and
  against a SQLite file: the server loses nothing;
- basic-auth mode: a user with the default READ permission cannot create runs in the
  benchmark experiment (clear error, exit 2, nothing created), and no credential lands in
  params, tags, artifacts or the CLI output.

Slow: PostgreSQL and mlflow server start-up (~10 s), plus several small benchmark runs. One
PostgreSQL cluster serves the module (each server its own databases), and the benchmark
processes use the session's Prefect server (tests/conftest.py) instead of starting one each:
neither is what these tests are about.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from pgserver import create_database, private_dir, running_mlflow_server, running_postgres, running_prefect_server

from tasks.measure import keys as K
from tests.repo import ANY_STEADY, NO_SYSTEM_METRICS, REPO, TINY_RUN

OVERRIDES = [
    *TINY_RUN,
    *ANY_STEADY,
    *NO_SYSTEM_METRICS,
    # four processes share 2 cores: each is "busy" by the host-load rule, and history leaves
    # INVALID runs out; this test is about the shared server, not about the figures
    "run.max_host_load=1.0",
]
CONTRACT = [
    K.E2E_PREDICT_SECONDS,
    K.E2E_PREDICT_ROWS_PER_S,
    K.E2E_TRAIN_SECONDS,
    K.E2E_TRAIN_ROWS_PER_S,
    K.STEADY_ROWS_PER_S,
    K.FIRST_CALL_SECONDS,
    K.TRAIN_STEADY_ROWS_PER_S,
    K.quality("accuracy"),
    K.HOST_PEAK_BYTES,
    *(K.stage_seconds(s, phase) for phase in K.PHASES for s in K.PHASE_STAGES[phase]),
]
ARTIFACTS = {"spec.yaml", "stages.json", "predictions_sample.csv", "checkpoint"}


def _env(tmp: Path, uri: str, name: str, **extra: str) -> dict[str, str]:
    env = dict(
        os.environ,
        MLFLOW_TRACKING_URI=uri,
        PREFECT_HOME=str(tmp / f"prefect-{name}"),
        RELFLOW_LOCK_FILE=str(tmp / f"{name}.lock"),
        PYTHONPATH=str(REPO),
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="600",
        **extra,
    )
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "PREFECT_API_URL"):
        if key not in extra:
            env.pop(key, None)
    return env


def _bench_cmd(*more: str) -> list[str]:
    return [sys.executable, "-m", "flows.cli", "run", *(a for o in OVERRIDES for a in ("--set", o)), *more]


@pytest.fixture(scope="module")
def pg():
    """One PostgreSQL cluster for the module; each MLflow server gets databases of its own."""
    with private_dir() as tmp_path, running_postgres(tmp_path / "pg") as server:
        yield server


@pytest.fixture(scope="module")
def pg_mlflow(pg):
    """One PostgreSQL-backed MLflow server for the tests that only log to it (the four hosts'
    runs and the load test, each in experiments of its own): its start-up and migrations are
    paid once. The auth test runs its own server (another app)."""
    with private_dir() as tmp_path, running_mlflow_server(create_database(pg, "mlflow"), tmp_path / "server") as url:
        yield tmp_path, url


@pytest.fixture
def prefect_api(_cli_prefect_server, tmp_path) -> Iterator[str]:
    """The session's Prefect server for the benchmark processes (one server, as a team runs
    it); a server of the test's own when the session has none."""
    api = _cli_prefect_server or os.environ.get("PREFECT_API_URL")
    if api:
        yield api
        return
    with running_prefect_server(tmp_path / "prefect") as own:
        yield own


@pytest.mark.slow
def test_four_benchmark_processes_log_to_a_postgres_backed_server(tpch_small, pg_mlflow, prefect_api):
    tmp_path, url = pg_mlflow
    api = prefect_api
    procs = []
    for i in range(4):  # four hosts: each its own host lock, all at once; one Prefect server
        work = tmp_path / f"host{i}"
        work.mkdir()
        with open(work / "run.log", "w") as log:  # the child keeps its own descriptor
            procs.append(
                (
                    subprocess.Popen(
                        _bench_cmd("--set", f"run.seed={i}", "--json", str(work / "s.json")),
                        env=_env(tmp_path, url, f"host{i}", PREFECT_API_URL=api),
                        cwd=work,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    ),
                    work,
                )
            )
    for proc, work in procs:
        code = proc.wait(timeout=900)
        assert code == 0, (work / "run.log").read_text()[-3000:]
    client = MlflowClient(tracking_uri=url)
    exp = client.get_experiment_by_name("tpch-orders")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 4 and {r.info.status for r in runs} == {"FINISHED"}
    for r in runs:
        assert not [k for k in CONTRACT if k not in r.data.metrics], r.data.metrics.keys()
        assert {a.path for a in client.list_artifacts(r.info.run_id)} >= ARTIFACTS
    assert exp.artifact_location.startswith("mlflow-artifacts:")  # proxied by the server
    assert list((tmp_path / "server" / "artifacts").rglob("spec.yaml"))

    # reports read the same runs back through the server, unchanged
    env = _env(tmp_path, url, "reports", PREFECT_API_URL=api)
    a, b = (r.info.run_id for r in runs[:2])
    commands = {
        "compare": ["compare", a, b],
        "history": ["history", "tpch-orders"],
        "dashboard": ["dashboard", "--experiment", "tpch-orders", "--out", str(tmp_path / "dash"), "--no-png"],
        "ui": ["ui"],
    }

    def report(args: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "flows.cli", *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )

    # two at a time (2 cores): each is mostly a CLI process's imports, and they only read
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(zip(commands, pool.map(report, commands.values()), strict=True))
    for name, proc in done.items():
        assert proc.returncode == 0, (name, proc.stdout[-2000:], proc.stderr[-2000:])
    assert (tmp_path / "dash" / "index.html").exists()
    assert url in done["ui"].stdout  # `ui` points at the server's own UI


@pytest.mark.slow
def test_load_test_loses_nothing_on_the_server(pg_mlflow):
    tmp_path, url = pg_mlflow
    # the load test logs into an experiment of its own (load-test-<id>) on the shared server
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "bench_tracking.py"),
            "--uri",
            url,
            "--uri",
            f"sqlite:///{tmp_path / 'mlflow.db'}",
            "--processes",
            "4",
            "--runs",
            "3",
        ],
        env=_env(tmp_path, url, "load"),
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(done.stdout)  # the concurrent-logging table (pytest -s)
    assert done.returncode == 0, done.stderr[-3000:]
    results = {r["store"]: r for r in json.loads(done.stdout.strip().splitlines()[-1])["results"]}
    server = results["server"]
    assert server["runs_complete"] == server["runs_expected"] == 12 and server["errors"] == 0
    sqlite = results["sqlite"]  # whatever SQLite does, the count must add up: nothing silently lost
    assert sqlite["runs_complete"] + sqlite["lost"] == sqlite["runs_expected"]
    assert sqlite["lost"] == 0 or sqlite["errors"] > 0 or 0 in sqlite["process_exit_codes"]


@pytest.mark.slow
def test_basic_auth_read_only_user_cannot_create_runs(tpch_small, pg, prefect_api):
    admin_pw, writer_pw, reader_pw = "adm-Secret-7731", "wr-Secret-4410", "rd-Secret-9902"
    with private_dir() as tmp_path:
        auth_ini = tmp_path / "basic_auth.ini"  # users and permissions in PostgreSQL too
        auth_db = create_database(pg, "mlflow_auth")
        auth_ini.write_text(
            f"[mlflow]\ndefault_permission = READ\ndatabase_uri = {auth_db}\n"
            "admin_username = admin\nauthorization_function = "
            "mlflow.server.auth:authenticate_request_basic_auth\n"
        )
        server_env = {
            "MLFLOW_AUTH_ADMIN_PASSWORD": admin_pw,
            "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-secret-key",
            "MLFLOW_AUTH_CONFIG_PATH": str(auth_ini),
        }
        with running_mlflow_server(
            create_database(pg, "mlflow_basic_auth"), tmp_path / "server", app_name="basic-auth", env=server_env
        ) as url:
            from mlflow.server.auth.client import AuthServiceClient

            os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = "admin", admin_pw
            try:
                admin = AuthServiceClient(url)
                admin.create_user("bench", writer_pw)
                admin.create_user("viewer", reader_pw)
            finally:
                os.environ.pop("MLFLOW_TRACKING_USERNAME")
                os.environ.pop("MLFLOW_TRACKING_PASSWORD")

            def bench(user: str, pw: str, name: str) -> subprocess.CompletedProcess:
                work = tmp_path / name
                work.mkdir()
                # predict mode: permissions and secrets are the point here, not training
                return subprocess.run(
                    _bench_cmd("--set", "run.mode=predict"),
                    cwd=work,
                    capture_output=True,
                    text=True,
                    timeout=1800,
                    env=_env(
                        tmp_path,
                        url,
                        name,
                        MLFLOW_TRACKING_USERNAME=user,
                        MLFLOW_TRACKING_PASSWORD=pw,
                        PREFECT_API_URL=prefect_api,
                    ),
                )

            wrote = bench("bench", writer_pw, "writer")  # creates the experiment: MANAGE on it
            assert wrote.returncode == 0, wrote.stdout[-2000:] + wrote.stderr[-2000:]
            refused = bench("viewer", reader_pw, "viewer")  # default READ everywhere
            assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
            assert "PERMISSION_DENIED" in refused.stdout + refused.stderr
            assert "viewer" in refused.stdout + refused.stderr and "tpch-orders" in refused.stdout + refused.stderr

            os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = "admin", admin_pw
            try:
                client = MlflowClient(tracking_uri=url)
                exp = client.get_experiment_by_name("tpch-orders")
                runs = client.search_runs([exp.experiment_id])
                assert len(runs) == 1 and runs[0].info.status == "FINISHED"  # the viewer created nothing
                run = runs[0]
                texts = [
                    json.dumps(run.data.params),
                    json.dumps(run.data.tags),
                    wrote.stdout,
                    wrote.stderr,
                    refused.stdout,
                    refused.stderr,
                ]
                for art in ("spec.yaml", "stages.json", "predictions_sample.csv"):
                    texts.append(Path(client.download_artifacts(run.info.run_id, art, str(tmp_path))).read_text())
            finally:
                os.environ.pop("MLFLOW_TRACKING_USERNAME")
                os.environ.pop("MLFLOW_TRACKING_PASSWORD")
    blob = "\n".join(texts)
    for secret in (admin_pw, writer_pw, reader_pw, "test-secret-key"):
        assert secret not in blob


def test_credentials_in_the_tracking_uri_are_refused(monkeypatch):
    from tasks.runtime.errors import UserError
    from tasks.tracking.uri import tracking_uri

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://bench:pw@127.0.0.1:5000")
    with pytest.raises(UserError, match="MLFLOW_TRACKING_USERNAME"):
        tracking_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking_uri() == "http://127.0.0.1:5000"
