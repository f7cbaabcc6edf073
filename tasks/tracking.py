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
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import mlflow  # noqa: E402
from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

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
            self.experiment_id = self.client.create_experiment(
                experiment, artifact_location=default_artifact_root(self.uri))
        else:
            self.experiment_id = exp.experiment_id
        self.experiment = experiment
        self.run_id: str | None = None

    def start(self, run_name: str, tags: dict[str, str], parent_run_id: str | None = None) -> str:
        tags = dict(tags)
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        self.run_id = run.info.run_id
        return self.run_id

    def log_params(self, params: dict[str, Any]) -> None:
        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + MAX_PARAMS_PER_BATCH])

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        now = int(time.time() * 1000)
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

    def finish(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")

    def fail(self, error: BaseException) -> None:
        """End the run FAILED (KILLED for interrupts), with the error recorded."""
        if self.run_id is None:
            return
        killed = isinstance(error, KeyboardInterrupt | SystemExit)
        try:
            self.set_tags({"relflow.error": f"{type(error).__name__}: {error}"})
            self.log_text("".join(traceback.format_exception(error)), "error.txt")
        finally:
            self.client.set_terminated(self.run_id, "KILLED" if killed else "FAILED")


def get_run(run_id: str, uri: str | None = None) -> mlflow.entities.Run:
    return MlflowClient(tracking_uri=uri or tracking_uri()).get_run(run_id)
