"""A sweep fanned out to two benchmark hosts, for real: ``prefect server start`` on a free
loopback port, a process work pool, two ``prefect worker start --limit 1`` processes standing
in for two hosts (each its own host lock), ``relflow-bench sweep ... --pool``.

1. a sweep of 3 configurations over both hosts at once (each worker runs one at a time, so
   the first two configurations start one on each host), and one worker is killed (SIGKILL to
   the worker and its flow-run process, which Prefect starts in a session of its own, as when
   a host dies) while it runs a configuration: that flow run ends CRASHED in Prefect and its
   MLflow child FAILED (nothing left RUNNING), the sweep reports it with each configuration's
   worker and exits 1, and the surviving worker runs the rest (the third configuration waits
   for a free host: with a worker each busy, it runs on the survivor); every finished child is
   tagged with the worker that ran it;
2. rerunning the same sweep runs only the missing configuration.

Slow: server start-up plus four small benchmark runs in worker subprocesses (the sweeps were 4
and 4 configurations: 9 runs, 321 s in CI; then 2 and 3: 6 runs, 126 s of a 24-minute suite; a
separate two-configuration sweep proved only what the killed host's sweep shows too: both
hosts take work at once, and the summary names each configuration's worker).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from pgserver import private_dir, running_postgres, running_prefect_server

from tests.repo import ANY_STEADY, FEW_SHORT_BATCHES, NO_SYSTEM_METRICS, REPO, TINY_MODEL

SPEC = REPO / "benchmarks" / "tpch_orders.yaml"
# predict mode (untrained weights): this test is about where runs go, not about quality
SMALL = [*TINY_MODEL, *FEW_SHORT_BATCHES, "run.mode=predict", *ANY_STEADY, *NO_SYSTEM_METRICS]
POOL = "relflow-hosts"


def _worker(name: str, env: dict[str, str], tmp: Path) -> subprocess.Popen:
    with open(tmp / f"worker-{name}.log", "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            ["prefect", "worker", "start", "--pool", POOL, "--name", name, "--limit", "1", "--type", "process"],
            env=dict(env, RELFLOW_LOCK_FILE=str(tmp / f"{name}.lock")),
            cwd=tmp,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _wait_online(api: str, names: set[str], procs: dict[str, subprocess.Popen], timeout: float = 600) -> None:
    """Until every worker in ``names`` has sent a heartbeat to the pool (a two-configuration sweep
    needs both hosts polling when it starts, or the first one up could run both in turn)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    deadline = time.monotonic() + timeout
    with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as pc:
        while True:
            online = {
                w.name for w in pc.read_workers_for_work_pool(POOL) if getattr(w.status, "value", w.status) == "ONLINE"
            }
            if names <= online:
                return
            dead = [n for n, p in procs.items() if p.poll() is not None]
            assert not dead and time.monotonic() < deadline, f"workers not online: {names - online}, exited: {dead}"
            time.sleep(0.5)


def _children(client: MlflowClient, seeds: set[str]) -> list:
    exp = client.get_experiment_by_name("tpch-orders")
    runs = client.search_runs([exp.experiment_id]) if exp else []
    return [
        r for r in runs if r.data.tags.get("relflow.sweep.role") == "child" and r.data.params.get("run.seed") in seeds
    ]


@pytest.mark.slow
def test_sweep_fans_out_to_two_workers_and_survives_a_killed_one(tpch_small):
    with ExitStack() as stack:
        tmp_path = stack.enter_context(private_dir())
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        MlflowClient(tracking_uri=uri).search_experiments()  # create the store before several processes use it
        # The Prefect server on PostgreSQL, as a team runs it: on its default SQLite file worker
        # heartbeats failed with "database is locked" on this busy host.
        pg = stack.enter_context(running_postgres(tmp_path / "pg"))
        from pgserver import create_database

        create_database(pg, "prefect")
        api = stack.enter_context(
            running_prefect_server(
                tmp_path / "prefect",
                env={"PREFECT_API_DATABASE_CONNECTION_URL": pg.url("prefect", driver="postgresql+asyncpg")},
            )
        )
        env = dict(
            os.environ,
            PREFECT_API_URL=api,
            PREFECT_HOME=str(tmp_path / "client-home"),
            MLFLOW_TRACKING_URI=uri,
            PYTHONPATH=str(REPO),
            PREFECT_WORKER_QUERY_SECONDS="2",
            PREFECT_WORKER_HEARTBEAT_SECONDS="10",
            PREFECT_LOGGING_LEVEL="INFO",
        )
        made = subprocess.run(
            ["prefect", "work-pool", "create", POOL, "--type", "process"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert made.returncode == 0, made.stdout + made.stderr
        workers = {n: _worker(n, env, tmp_path) for n in ("host-a", "host-b")}
        for w in workers.values():
            stack.callback(_stop, w)
        _wait_online(api, set(workers), workers)  # both hosts poll before the first sweep
        sets = [a for o in SMALL for a in ("--set", o)]

        def sweep(seeds: str, **kw) -> subprocess.Popen:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "flows.cli",
                    "sweep",
                    str(SPEC),
                    "--grid",
                    f"run.seed={seeds}",
                    "--pool",
                    POOL,
                    *sets,
                ],
                env=env,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                **kw,
            )

        client = MlflowClient(tracking_uri=uri)

        # 1. kill host-b while it runs one of the sweep's configurations (both hosts took one)
        second = sweep("10,11,12")
        deadline = time.monotonic() + 900
        while True:
            busy = [
                k
                for k in _children(client, {"10", "11", "12"})
                if k.info.status == "RUNNING" and k.data.tags.get("relflow.worker") == "host-b"
            ]
            if busy:
                break
            assert second.poll() is None and time.monotonic() < deadline, "host-b never ran a configuration"
            time.sleep(1.0)
        # The host dies: the worker and its flow-run process (Prefect starts that in its own session).
        import psutil

        victim = workers["host-b"].pid
        doomed = [victim, *(c.pid for c in psutil.Process(victim).children(recursive=True))]
        for pid in doomed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        workers["host-b"].wait(timeout=30)
        killed_run = busy[0].info.run_id
        out2, _ = second.communicate(timeout=1500)
        print(out2)
        assert second.returncode == 1, out2[-4000:]
        assert "FAILED" in out2 and "CRASHED" in out2 and "host-b" in out2, out2[-3000:]
        kids = _children(client, {"10", "11", "12"})
        assert "RUNNING" not in {k.info.status for k in kids}
        # The pool ends it FAILED, unless a configuration planned on this host after the kill
        # found its process gone first and ended it KILLED (tasks/runtime/liveness.py, found stale).
        dead = client.get_run(killed_run)
        assert dead.info.status == "FAILED" or (
            dead.info.status == "KILLED" and dead.data.tags.get("relflow.found_stale") == "true"
        ), dead.info.status
        finished = [k for k in kids if k.info.status == "FINISHED"]
        assert len(finished) == 2
        # every child is tagged with the worker that ran it, both hosts took work (the killed
        # configuration host-b, the survivor the rest; host-b may have finished one before it
        # died), and the summary names both
        assert dead.data.tags.get("relflow.worker") == "host-b"
        assert "host-a" in {k.data.tags.get("relflow.worker") for k in finished}
        assert {k.data.tags.get("relflow.worker") for k in kids} <= {"host-a", "host-b"}
        assert "host-a" in out2

        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        # Prefect reads its settings once; an environment variable set now would be ignored
        # and the query would go to this test session's own server.
        with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as pc:
            states = [fr.state.type.value for fr in pc.read_flow_runs() if fr.state]
        assert "CRASHED" in states and "RUNNING" not in states, states

        # 2. rerun: only the missing configuration runs (on the surviving host)
        third = sweep("10,11,12")
        out3, _ = third.communicate(timeout=1500)
        print(out3)
        assert third.returncode == 0, out3[-4000:]
        assert out3.count("skipped, already FINISHED") == 2, out3[-3000:]
        assert "1 ran, 2 skipped" in out3
        kids = _children(client, {"10", "11", "12"})
        assert sum(k.info.status == "FINISHED" for k in kids) == 3
