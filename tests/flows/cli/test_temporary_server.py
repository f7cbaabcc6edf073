"""``relflow-bench run`` as a new user runs it (issue 35): no ``PREFECT_API_URL``, so Prefect
starts its temporary server for the process and stops it at exit, a fresh host cache, so the
floor ledger's no-op task calls run after the timed region, as on a first run.

The run used to end with ``ERROR | prefect.server.services.task_run_recorder - Error flushing
1 events`` and a CancelledError traceback, twice, after its summary: the server was stopped
while its task-run recorder, one SQLite transaction per event and seconds behind the run,
still had events to write. The write in flight was cancelled (the tracebacks) and the events
not yet consumed were dropped: Prefect's database missed most of the run's task runs (54 of
70 on a busy 2-core host). flows/cli/temporary_server.py has the fix.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.repo import SMALL_RUN

pytestmark = pytest.mark.slow  # a real CLI run with Prefect's temporary server

# The default TPC-H workload, small: a tiny model, one epoch, two chunks.
OVERRIDES = [
    *SMALL_RUN,
    "run.chunk_rows=10000",
    "run.packing=off",
    "run.max_host_load=null",  # other tests share this host's cores
]


def _task_runs(db: Path) -> tuple[int, dict[str, int]]:
    """(task runs the server received events for, recorded task runs by state type) in the
    temporary server's database."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        sent = con.execute(
            "SELECT COUNT(DISTINCT resource_id) FROM events WHERE event LIKE 'prefect.task-run.%'"
        ).fetchone()[0]
        recorded = dict(con.execute("SELECT state_type, COUNT(*) FROM task_run GROUP BY state_type").fetchall())
    return sent, recorded


def test_a_run_on_the_temporary_server_prints_no_error_after_its_summary_and_records_every_task_run(
    tmp_path, tpch_small
):
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "RELFLOW_CACHE_DIR": str(tmp_path / "cache"),  # a new host: the floor ledger is measured
        "COLUMNS": "100",
    }
    env.pop("PREFECT_API_URL", None)  # never the session's server: the temporary one
    sets = [arg for item in OVERRIDES for arg in ("--set", item)]
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", *sets],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "validity" in proc.stdout  # the summary was printed
    lines = (proc.stdout + proc.stderr).splitlines()
    bad = [line for line in lines if "Traceback" in line or "ERROR" in line]
    assert not bad, "\n".join(lines[-80:])
    sent, recorded = _task_runs(tmp_path / "prefect-home" / "prefect.db")
    assert sent > 0
    assert recorded == {"COMPLETED": sent}


def test_the_wait_counts_the_task_runs_prefect_records(prefect_harness, monkeypatch):
    """What the CLI waits for is exact: every task run of the flow run, completed or failed,
    counted from the server's events and found recorded in a final state."""
    from prefect import flow, task
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.cli import temporary_server

    @task
    def one() -> None:
        pass

    @task
    def two(x: int) -> int:
        if x > 2:
            raise ValueError("a failed task run is a final state too")
        return x

    @flow
    def some_tasks(fail: bool) -> None:
        for _ in range(3):
            one()
        two(1)
        two(2)
        if fail:
            two(3)

    ended: list = []
    monkeypatch.setattr(temporary_server, "settle", lambda run_id, created: ended.append((run_id, created)))
    with temporary_server.recorded(some_tasks) as hooked:
        hooked(fail=False)
    with pytest.raises(ValueError), temporary_server.recorded(some_tasks) as hooked:
        hooked(fail=True)
    assert len(ended) == 2
    counts = [temporary_server.wait_for_records(run_id, created) for run_id, created in ended]
    assert counts == [5, 6]
    with get_client(sync_client=True) as client:
        for (run_id, _), count in zip(ended, counts, strict=True):
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
            assert len(runs) == count
            assert all(r.state_type is not None and r.state_type.value in temporary_server.FINAL_STATES for r in runs)
