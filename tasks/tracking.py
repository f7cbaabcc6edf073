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
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow  # noqa: E402
from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from tasks.clock import unix_time  # noqa: E402

MAX_PARAMS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000


def tracking_uri() -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"
    if uri.startswith(("http://", "https://")) and "@" in uri.split("//", 1)[1].split("/", 1)[0]:
        # The URI is printed, logged and stored in deployments: credentials never go in it.
        from tasks.errors import UserError

        raise UserError("MLFLOW_TRACKING_URI carries credentials (user:password@host); remove them and "
                        "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD instead.")
    return uri


def is_server(uri: str) -> bool:
    """A tracking server (``mlflow server``) rather than a store this process opens itself."""
    return uri.startswith(("http://", "https://"))


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


class SystemSampler:
    """MLflow's system-metric collectors on a thread, kept in memory (no store access)."""

    def __init__(self, interval_s: float, uri: str) -> None:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        # Only for its collector list (CPU, disk, network, GPU when present); its own thread,
        # which logs to the store, is never started.
        self.monitors = SystemMetricsMonitor("unused", sampling_interval=interval_s,
                                             tracking_uri=uri).monitors
        self.interval_s = interval_s
        self.samples: list[tuple[int, dict[str, float]]] = []  # (unix ms, metrics)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        metrics: dict[str, float] = {}
        for m in self.monitors:
            m.collect_metrics()
            metrics.update(m.aggregate_metrics())
            m.clear_metrics()
        self.samples.append((int(unix_time() * 1000), metrics))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> None:
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="relflow-system-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


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
        tags = dict(tags)
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        try:
            run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        except mlflow.exceptions.MlflowException as err:
            if err.error_code != "PERMISSION_DENIED":
                raise
            from tasks.errors import UserError

            user = os.environ.get("MLFLOW_TRACKING_USERNAME") or "(no MLFLOW_TRACKING_USERNAME set)"
            raise UserError(f"The MLflow server at {self.uri} refused user '{user}' creating a run in "
                            f"experiment '{self.experiment}' (PERMISSION_DENIED): ask its admin for "
                            "EDIT permission on that experiment, or run as a user who has it.") from None
        self.run_id = run.info.run_id
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
        """Sample MLflow's system metrics (CPU, memory, disk, network, GPU) into memory.

        Nothing reaches the store while sampling (MLflow's own monitor thread writes and
        reads the store every interval, which would put store traffic inside the timed
        region); ``flush_system_metrics`` logs the samples, with their times, afterwards."""
        self._monitor = SystemSampler(interval_s, self.uri)
        self._monitor.start()

    def stop_system_metrics(self) -> None:
        monitor = getattr(self, "_monitor", None)
        if monitor is not None:
            monitor.stop()

    def flush_system_metrics(self) -> None:
        """Log the buffered samples (``system/<name>``, one step per sample)."""
        monitor = getattr(self, "_monitor", None)
        if monitor is None:
            return
        monitor.stop()
        self._monitor = None
        items = [Metric(f"system/{k}", float(v), ts, step)
                 for step, (ts, sample) in enumerate(monitor.samples) for k, v in sample.items()]
        for i in range(0, len(items), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=items[i:i + MAX_METRICS_PER_BATCH])

    def finish(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")

    def fail(self, error: BaseException) -> None:
        """End the run FAILED (KILLED for interrupts), with the error recorded."""
        if self.run_id is None:
            return
        killed = isinstance(error, KeyboardInterrupt | SystemExit)
        self.stop_system_metrics()
        try:
            self.set_tags({"relflow.error": f"{type(error).__name__}: {error}"})
            self.log_text("".join(traceback.format_exception(error)), "error.txt")
        finally:
            self.client.set_terminated(self.run_id, "KILLED" if killed else "FAILED")

    def reopen(self, run_id: str) -> str:
        """Continue an existing run of this experiment (a resumed sweep's parent): RUNNING again."""
        self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        return run_id


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
