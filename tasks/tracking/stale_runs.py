"""Ending stale runs: RUNNING runs whose process on this host is gone (SIGKILL, out of memory).

Every run is tagged with its process (``tasks/runtime/liveness.py``); any invocation that
reaches the store sweeps first (``tasks/run/checks/preflight.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import mlflow
from mlflow.entities import RunTag
from mlflow.tracking import MlflowClient

from tasks.runtime import liveness
from tasks.tracking.uri import tracking_uri


def end_stale_runs(uri: str | None = None) -> list[str]:
    """End KILLED every RUNNING run recorded by a process of this host that no longer exists
    (SIGKILL, out-of-memory kill), tagged ``relflow.found_stale``; returns their ids."""
    uri = uri or tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return []  # no store yet, so no runs; opening it would create it before any check ran
    client = MlflowClient(tracking_uri=uri)
    exp_ids = [e.experiment_id for e in client.search_experiments()]
    if not exp_ids:
        return []
    host = liveness.process_host()
    found = []
    for run in client.search_runs(
        exp_ids,
        filter_string=(f"attributes.status = 'RUNNING' and tags.\"relflow.process_host\" = '{host}'"),
        max_results=1000,
    ):
        tags = run.data.tags
        if liveness.is_alive(tags):
            continue
        try:
            client.log_batch(
                run.info.run_id,
                tags=[
                    RunTag("relflow.found_stale", "true"),
                    RunTag(
                        "relflow.error",
                        f"process {tags.get('relflow.pid')} ended without ending "
                        f"this run (SIGKILL or out-of-memory); found stale by process {os.getpid()}",
                    ),
                ],
            )
            client.set_terminated(run.info.run_id, "KILLED")
        except mlflow.exceptions.MlflowException:
            continue  # another user's run this user may not edit (an auth server): theirs to end
        found.append(run.info.run_id)
    return found
