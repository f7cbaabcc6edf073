"""Reading runs back (compare, history, dashboards, sweeps): MLflow runs as plain ``StoredRun``s.

Nothing here writes to the store; ``writer.py`` does."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from mlflow.tracking import MlflowClient

from tasks.runtime.errors import UserError
from tasks.runtime.masking import mask_uri
from tasks.tracking.uri import tracking_uri


@dataclass(frozen=True)
class StoredRun:
    """One MLflow run as read back from the tracking store, as plain data: what reports read,
    with no MLflow types inside (a run as it is written is ``writer.Tracker``'s)."""

    run_id: str
    run_name: str
    experiment: str
    status: str  # FINISHED | FAILED | KILLED | RUNNING | SCHEDULED
    start_time_ms: int
    end_time_ms: int | None
    metrics: dict[str, float]
    params: dict[str, str]
    tags: dict[str, str]

    @property
    def started_at(self) -> dt.datetime:
        """Start time in UTC (what reports put on a time axis)."""
        return dt.datetime.fromtimestamp(self.start_time_ms / 1000, tz=dt.UTC)

    @property
    def label(self) -> str:
        """A short name for tables and chart axes: run name plus the id's first 8 characters."""
        return f"{self.run_name} {self.run_id[:8]}"


def _stored_run(run: Any, experiment: str) -> StoredRun:
    return StoredRun(
        run_id=run.info.run_id,
        run_name=run.info.run_name or "",
        experiment=experiment,
        status=run.info.status,
        start_time_ms=int(run.info.start_time or 0),
        end_time_ms=int(run.info.end_time) if run.info.end_time else None,
        metrics=dict(run.data.metrics),
        params=dict(run.data.params),
        tags={k: v for k, v in run.data.tags.items()},
    )


def experiment_ids(uri: str | None = None) -> dict[str, str]:
    """Active experiments by name -> id, oldest first."""
    client = MlflowClient(tracking_uri=uri or tracking_uri())
    return {e.name: e.experiment_id for e in client.search_experiments(order_by=["creation_time ASC"])}


def runs_page(ui_url: str, experiment_id: str) -> str:
    """The MLflow UI's page of one experiment's runs table.

    MLflow 3.17's UI picks its landing page from a browser-side "workflow type" (default GenAI:
    a traces overview) rather than from the experiment's kind tag, so the link names the
    model-training view explicitly."""
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def experiment_names(uri: str | None = None) -> list[str]:
    """Names of the active experiments in the store, oldest first."""
    client = MlflowClient(tracking_uri=uri or tracking_uri())
    exps = client.search_experiments(order_by=["creation_time ASC"])
    return [e.name for e in exps]


def search_runs(
    experiment: str,
    *,
    status: str | None = "FINISHED",
    filter_string: str = "",
    uri: str | None = None,
    max_results: int = 5000,
) -> list[StoredRun]:
    """Runs of one experiment (by name) as ``StoredRun``s, oldest start time first.

    ``status`` keeps only runs in that state (``None``: all). ``filter_string`` is MLflow's
    search syntax, e.g. ``tags."relflow.host_fingerprint" = 'abc'``. An unknown experiment
    yields an empty list.
    """
    client = MlflowClient(tracking_uri=uri or tracking_uri())
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    clauses = [c for c in (filter_string, f"attributes.status = '{status}'" if status else "") if c]
    runs: list[StoredRun] = []
    token = None
    while len(runs) < max_results:
        page = client.search_runs(
            [exp.experiment_id],
            filter_string=" and ".join(clauses),
            max_results=min(1000, max_results - len(runs)),
            order_by=["attributes.start_time ASC"],
            page_token=token,
        )
        runs += [_stored_run(r, experiment) for r in page]
        token = page.token
        if not token:
            break
    return runs


def get_stored_run(run_id: str, uri: str | None = None) -> StoredRun:
    """One run by id (any status); raises ``UserError`` naming the id when it is absent."""
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=uri or tracking_uri())
    try:
        run = client.get_run(run_id)
    except MlflowException as err:
        raise UserError(
            f"no MLflow run with id '{run_id}' in {mask_uri(uri or tracking_uri())}: copy the id from "
            "`relflow-bench run` or the MLflow UI."
        ) from err
    return _stored_run(run, client.get_experiment(run.info.experiment_id).name)


def artifact_paths(run_id: str, uri: str | None = None) -> set[str]:
    """The paths of a run's top-level artifacts (files and folders)."""
    return {a.path for a in MlflowClient(tracking_uri=uri or tracking_uri()).list_artifacts(run_id)}


def metric_history(run_id: str, key: str, uri: str | None = None) -> list[float]:
    """All logged values of one metric in step order (e.g. a latency CDF, one value per step)."""
    client = MlflowClient(tracking_uri=uri or tracking_uri())
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))]
