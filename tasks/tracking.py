"""The one module that talks to MLflow.

Logging goes through ``MlflowClient`` by run id (MLflow's active run is per thread; Prefect
may run task code on other threads). Metrics and params are sent in batches, after the
timed regions. A run always ends: ``FINISHED``, ``FAILED`` (with the error as a tag and an
artifact) or ``KILLED`` (Ctrl-C, SIGTERM).

Default store: ``sqlite:///<cwd>/mlflow.db`` with artifacts in ``<cwd>/mlartifacts``,
unless ``MLFLOW_TRACKING_URI`` is set.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow  # noqa: E402
from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from tasks import interrupts, liveness  # noqa: E402
from tasks.clock import unix_time  # noqa: E402

MAX_PARAMS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def default_artifact_root(uri: str) -> str | None:
    """Artifacts beside a local SQLite store; a server or other store decides for itself."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    return None


def flatten(d: Any, prefix: str = "") -> dict[str, str]:
    """Nested spec -> dotted params; list items named by their ``name`` (branches)."""
    out: dict[str, str] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(d, list) and d and all(isinstance(x, dict) and "name" in x for x in d):
        for x in d:
            out.update(flatten(x, f"{prefix}{x['name']}."))
    else:
        out[prefix[:-1]] = str(d)
    return out


class Tracker:
    def __init__(self, experiment: str, uri: str | None = None) -> None:
        self.uri = uri or tracking_uri()
        self.client = MlflowClient(tracking_uri=self.uri)
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            try:
                self.experiment_id = self.client.create_experiment(
                    experiment, artifact_location=default_artifact_root(self.uri))
            except mlflow.exceptions.MlflowException:
                # Another process created it between our lookup and create: use theirs.
                exp = self.client.get_experiment_by_name(experiment)
                if exp is None:
                    raise
                self.experiment_id = exp.experiment_id
        else:
            self.experiment_id = exp.experiment_id
        self.experiment = experiment
        self.run_id: str | None = None

    def start(self, run_name: str, tags: dict[str, str], parent_run_id: str | None = None) -> str:
        tags = {**tags, **liveness.process_tags()}  # lets a later run find this one stale
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        self.run_id = run.info.run_id
        interrupts.track_run(self.run_id, self)
        return self.run_id

    def log_params(self, params: dict[str, Any]) -> None:
        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + MAX_PARAMS_PER_BATCH])

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        now = int(unix_time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        for i in range(0, len(items), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=items[i:i + MAX_METRICS_PER_BATCH])

    def set_tags(self, tags: dict[str, str]) -> None:
        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)[:5000]) for k, v in tags.items()])

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_text(self, text: str, name: str) -> None:
        self.client.log_text(self.run_id, text, name)

    def log_dict(self, data: Any, name: str) -> None:
        self.client.log_dict(self.run_id, data, name)

    def start_system_metrics(self, interval_s: float) -> None:
        """MLflow's own CPU/memory/GPU sampler for this run (a background thread)."""
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        self._monitor = SystemMetricsMonitor(self.run_id, sampling_interval=interval_s,
                                             tracking_uri=self.uri)
        self._monitor.start()

    def stop_system_metrics(self) -> None:
        monitor = getattr(self, "_monitor", None)
        if monitor is not None:
            monitor.finish()
            self._monitor = None

    def finish(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")
        interrupts.untrack_run(self.run_id)

    def fail(self, error: BaseException) -> None:
        """End the run FAILED (KILLED for interrupts), with the error recorded."""
        if self.run_id is None:
            return
        # Prefect turns SIGTERM inside a flow into its TerminationSignal (an ExternalSignal).
        killed = isinstance(error, KeyboardInterrupt | SystemExit) or any(
            c.__name__ == "ExternalSignal" for c in type(error).__mro__)
        interrupts.untrack_run(self.run_id)
        try:
            self.stop_system_metrics()
            self.set_tags({"relflow.error": f"{type(error).__name__}: {error}"})
            self.log_text("".join(traceback.format_exception(error)), "error.txt")
        finally:
            self.client.set_terminated(self.run_id, "KILLED" if killed else "FAILED")

    def reopen(self, run_id: str) -> str:
        """Continue an existing run of this experiment (a resumed sweep's parent): RUNNING again."""
        self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        self.set_tags(liveness.process_tags())  # this process holds it now
        interrupts.track_run(run_id, self)
        return run_id


def end_stale_runs(uri: str | None = None) -> list[str]:
    """End KILLED every RUNNING run recorded by a process of this host that no longer exists
    (SIGKILL, out-of-memory kill), tagged ``relflow.found_stale``; returns their ids."""
    client = MlflowClient(tracking_uri=uri or tracking_uri())
    exp_ids = [e.experiment_id for e in client.search_experiments()]
    if not exp_ids:
        return []
    host = liveness.process_host()
    found = []
    for run in client.search_runs(exp_ids, filter_string=(
            f"attributes.status = 'RUNNING' and tags.\"relflow.process_host\" = '{host}'"),
            max_results=1000):
        tags = run.data.tags
        if liveness.is_alive(tags):
            continue
        client.log_batch(run.info.run_id, tags=[
            RunTag("relflow.found_stale", "true"),
            RunTag("relflow.error", f"process {tags.get('relflow.pid')} ended without ending "
                   f"this run (SIGKILL or out-of-memory); found stale by process {os.getpid()}"),
        ])
        client.set_terminated(run.info.run_id, "KILLED")
        found.append(run.info.run_id)
    return found


def get_run(run_id: str, uri: str | None = None) -> mlflow.entities.Run:
    return MlflowClient(tracking_uri=uri or tracking_uri()).get_run(run_id)


# --- reading runs back (compare, history, dashboards) ----------------------------------


@dataclass(frozen=True)
class RunRecord:
    """One MLflow run as plain data: what reports read, with no MLflow types inside."""

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
    def label(self) -> str:
        """A short name for tables and chart axes: run name plus the id's first 8 characters."""
        return f"{self.run_name} {self.run_id[:8]}"


def _record(run: Any, experiment: str) -> RunRecord:
    return RunRecord(
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


def experiment_names(uri: str | None = None) -> list[str]:
    """Names of the active experiments in the store, oldest first."""
    client = MlflowClient(tracking_uri=uri or tracking_uri())
    exps = client.search_experiments(order_by=["creation_time ASC"])
    return [e.name for e in exps]


def search_runs(experiment: str, *, status: str | None = "FINISHED", filter_string: str = "",
                uri: str | None = None, max_results: int = 5000) -> list[RunRecord]:
    """Runs of one experiment (by name) as ``RunRecord``s, oldest start time first.

    ``status`` keeps only runs in that state (``None``: all). ``filter_string`` is MLflow's
    search syntax, e.g. ``tags."relflow.host_fingerprint" = 'abc'``. An unknown experiment
    yields an empty list.
    """
    client = MlflowClient(tracking_uri=uri or tracking_uri())
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    clauses = [c for c in (filter_string, f"attributes.status = '{status}'" if status else "") if c]
    records: list[RunRecord] = []
    token = None
    while len(records) < max_results:
        page = client.search_runs([exp.experiment_id], filter_string=" and ".join(clauses),
                                  max_results=min(1000, max_results - len(records)),
                                  order_by=["attributes.start_time ASC"], page_token=token)
        records += [_record(r, experiment) for r in page]
        token = page.token
        if not token:
            break
    return records


def get_run_record(run_id: str, uri: str | None = None) -> RunRecord:
    """One run by id (any status); raises ``LookupError`` naming the id when it is absent."""
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=uri or tracking_uri())
    try:
        run = client.get_run(run_id)
    except MlflowException as err:
        raise LookupError(f"no MLflow run with id '{run_id}' in {uri or tracking_uri()}") from err
    return _record(run, client.get_experiment(run.info.experiment_id).name)


def metric_history(run_id: str, key: str, uri: str | None = None) -> list[float]:
    """All logged values of one metric in step order (e.g. one per repeat)."""
    client = MlflowClient(tracking_uri=uri or tracking_uri())
    return [m.value for m in sorted(client.get_metric_history(run_id, key),
                                    key=lambda m: (m.step, m.timestamp))]
