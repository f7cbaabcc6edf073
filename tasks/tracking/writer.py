"""Writing a run to MLflow: the ``Tracker`` (create, log, end) and the system-metrics sampler.

Logging goes through ``MlflowClient`` by run id (MLflow's active run is per thread; Prefect
may run task code on other threads). Metrics and params are sent in batches, after the
timed regions. A run always ends: ``FINISHED``, ``FAILED`` (with the error as a tag and an
artifact) or ``KILLED`` (Ctrl-C, SIGTERM).

Default store: ``sqlite:///<cwd>/mlflow.db`` with artifacts in ``<cwd>/mlartifacts``,
unless ``MLFLOW_TRACKING_URI`` is set (``tasks/tracking/uri.py``).

What the MLflow UI shows a user: every benchmark experiment is tagged
``mlflow.experimentKind=custom_model_development`` (the UI opens on its runs table, not on
the GenAI traces overview); a run lists the tables it read as dataset inputs, the trained
model as an MLflow PyTorch model with a signature, and a markdown description (stage table
and verdict, tag ``mlflow.note.content``). Arrow schemas and table locations become MLflow's
types in ``adapters.py``; runs are read back in ``reader.py``.
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tasks.measure.clock import unix_time
from tasks.runtime import interrupts, liveness
from tasks.runtime.masking import mask_secrets, mask_uri
from tasks.tracking.adapters import dataset_source, mlflow_name, mlflow_schema
from tasks.tracking.uri import default_artifact_root, tracking_uri

if TYPE_CHECKING:
    import torch

    from tasks.tracking.datasets import DatasetInfo, ModelInterface
    from tasks.tracking.traces import RequestTrace

MAX_PARAMS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"  # a model-development experiment: the UI opens on runs
RUN_NOTE_TAG = "mlflow.note.content"  # the run page's description (markdown)
MAX_NOTE_CHARS = 8000


@contextmanager
def _fluent_uri(uri: str) -> Iterator[None]:
    """Points MLflow's fluent API at ``uri`` and afterwards restores both its global and
    MLFLOW_TRACKING_URI exactly. ``set_tracking_uri(previous)`` would pin the process to the
    URI in effect at the first call, and MLflow's own scoped setter deletes the variable."""
    import mlflow
    from mlflow.tracking._tracking_service import utils

    env = os.environ.get("MLFLOW_TRACKING_URI")
    previous = utils._tracking_uri
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)  # type: ignore[arg-type]  # None means "unset", as in MLflow's own scoped setter
        if env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = env


def _no_warning(requirements: list[str]) -> None:
    """Stands in for MLflow's requirement check in ``Tracker.log_model`` (see there)."""


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
        monitor: Any = SystemMetricsMonitor  # untyped in MLflow
        self.monitors: list[Any] = monitor("unused", sampling_interval=interval_s, tracking_uri=uri).monitors
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
                    experiment,
                    artifact_location=default_artifact_root(self.uri),
                    tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
                )
            except mlflow.exceptions.MlflowException:
                # Another process created it between our lookup and create: use theirs.
                exp = self.client.get_experiment_by_name(experiment)
                if exp is None:
                    raise
                self.experiment_id = exp.experiment_id
        else:
            self.experiment_id = exp.experiment_id
        if exp is not None and exp.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
            # Stores written before the tag existed (or created elsewhere) get it on next use.
            self.client.set_experiment_tag(self.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        self.experiment = experiment
        self.run_id: str | None = None

    @property
    def _id(self) -> str:
        if self.run_id is None:
            raise RuntimeError("Tracker.start() first: there is no run to log to")
        return self.run_id

    def start(self, run_name: str, tags: dict[str, str], parent_run_id: str | None = None) -> str:
        tags = {**tags, **liveness.process_tags()}  # lets a later run find this one stale
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        try:
            run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        except mlflow.exceptions.MlflowException as err:
            if err.error_code != "PERMISSION_DENIED":
                raise
            from tasks.runtime.errors import UserError

            user = os.environ.get("MLFLOW_TRACKING_USERNAME") or "(no MLFLOW_TRACKING_USERNAME set)"
            raise UserError(
                f"The MLflow server at {mask_uri(self.uri)} refused user '{user}' creating a run in "
                f"experiment '{self.experiment}' (PERMISSION_DENIED): ask its admin for "
                "EDIT permission on that experiment, or run as a user who has it."
            ) from None
        self.run_id = run.info.run_id
        interrupts.track_run(self.run_id, self)
        return self.run_id

    def log_params(self, params: dict[str, Any]) -> None:
        # Masked (tasks/runtime/masking.py): a free-form spec value may hold a URI with a secret.
        items = [Param(mlflow_name(k), mask_secrets(str(v))[:6000]) for k, v in params.items()]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self._id, params=items[i : i + MAX_PARAMS_PER_BATCH])

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        now = int(unix_time() * 1000)
        items = [Metric(mlflow_name(k), float(v), now, step) for k, v in metrics.items()]
        for i in range(0, len(items), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self._id, metrics=items[i : i + MAX_METRICS_PER_BATCH])

    def log(self, metrics: dict[str, float], step: int) -> None:
        """The logger interface of ``model.throughput.ThroughputCallback``."""
        self.log_metrics(metrics, step)

    def log_metric_steps(self, key: str, values: list[float]) -> None:
        """One metric as a series over steps 0..n-1 (e.g. a latency CDF), in one batch."""
        now = int(unix_time() * 1000)
        items = [Metric(mlflow_name(key), float(v), now, step) for step, v in enumerate(values)]
        for i in range(0, len(items), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self._id, metrics=items[i : i + MAX_METRICS_PER_BATCH])

    def set_tags(self, tags: dict[str, str]) -> None:
        self.client.log_batch(
            self._id, tags=[RunTag(mlflow_name(k), mask_secrets(str(v))[:5000]) for k, v in tags.items()]
        )

    def log_traces(self, traces: Sequence[RequestTrace]) -> None:
        """Each as an MLflow trace in the run's experiment, linked to the run (trace metadata
        ``mlflow.sourceRun``), every span at its recorded start and end; returns when all are
        stored. MLflow's trace exporter writes to the fluent API's store, and its async queue
        is flushed before that is restored."""
        if not traces:
            return
        with _fluent_uri(self.uri):
            for t in traces:
                root = self.client.start_trace(
                    t.name,
                    inputs=t.inputs,
                    experiment_id=self.experiment_id,
                    start_time_ns=t.start_ns,
                    run_id=self._id,
                    tags=t.tags,
                    attributes=t.attributes,
                )
                for s in t.spans:
                    span = self.client.start_span(
                        s.name, trace_id=root.trace_id, parent_id=root.span_id, start_time_ns=s.start_ns
                    )
                    self.client.end_span(root.trace_id, span.span_id, end_time_ns=s.end_ns)
                self.client.end_trace(root.trace_id, outputs=t.outputs, end_time_ns=t.end_ns)
            mlflow.flush_trace_async_logging()

    def count_traces(self) -> int:
        """Traces stored for the run (what ``requests.traces_logged`` reports)."""
        n, token = 0, None
        while True:
            page = self.client.search_traces(
                locations=[self.experiment_id], run_id=self._id, include_spans=False, max_results=500, page_token=token
            )
            n += len(page)
            token = page.token
            if not token:
                return n

    def set_description(self, markdown: str) -> None:
        """The run page's description (MLflow renders it as markdown)."""
        self.client.set_tag(self._id, RUN_NOTE_TAG, markdown[:MAX_NOTE_CHARS])

    def log_datasets(self, datasets: Sequence[DatasetInfo]) -> None:
        """The tables the run read, as MLflow dataset inputs (the runs table's Dataset column)."""
        from mlflow.data.meta_dataset import MetaDataset
        from mlflow.entities import DatasetInput, InputTag
        from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

        inputs = []
        for d in datasets:
            # MLflow's stubs call MetaDataset abstract (profile); it is the documented class.
            meta = MetaDataset(
                dataset_source(d.source),
                name=d.name,
                digest=d.digest,  # type: ignore[abstract]
                schema=mlflow_schema(d.schema),
            )
            inputs.append(DatasetInput(meta._to_mlflow_entity(), tags=[InputTag(MLFLOW_DATASET_CONTEXT, d.context)]))
        for attempt in range(DATASET_RACE_ATTEMPTS):
            try:
                self.client.log_inputs(self._id, datasets=inputs)
                return
            except MlflowException as err:
                # MLflow's SQL store looks a dataset up, then inserts it: two runs of the same
                # tables logging at once on a shared server (PostgreSQL: four hosts in
                # test_tracking_server) can both miss and one insert fails on the unique key.
                # Its transaction rolled back; the next try finds the other's row and links it.
                if not _dataset_race(err) or attempt == DATASET_RACE_ATTEMPTS - 1:
                    raise

    def log_model(self, model: torch.nn.Module, interface: ModelInterface) -> str:
        """``model`` as an MLflow PyTorch model named ``model`` of this run, with a signature
        (the nested rows it takes, its outputs' dtypes and shapes). The model's package travels
        with it, so ``mlflow.pytorch.load_model`` needs no checkout. Pickled, not ``pt2``: the
        model takes a ``Batch`` of nested tensors, which ``torch.export`` cannot trace from the
        array examples that format requires. Returns the model URI."""
        import mlflow.pytorch
        import mlflow.utils.environment as mlflow_env
        import numpy as np
        from mlflow.models.signature import ModelSignature
        from mlflow.types.schema import Schema, TensorSpec

        signature = ModelSignature(
            inputs=mlflow_schema(interface.inputs),
            outputs=Schema(
                [TensorSpec(np.dtype(dtype), shape, name) for name, (dtype, shape) in interface.outputs.items()]
            ),
        )
        # Created here so it belongs to this run's experiment (the flavour alone would put it in
        # the fluent API's current experiment, "Default").
        logged = self.client.create_logged_model(self.experiment_id, name="model", source_run_id=self._id)
        flavour_log = logging.getLogger("mlflow.pytorch")
        level = flavour_log.level
        flavour_log.setLevel(logging.ERROR)  # its pickle-format warning: chosen deliberately, said above
        # Before saving, MLflow checks the requirements against this environment only to warn
        # about a mismatch: it maps every installed distribution to its modules first
        # (importlib.metadata, 1.4 s once per process, i.e. per run). Ours are pinned to the
        # versions this process runs (tasks/tracking/datasets.py), so it cannot warn.
        no_check = (
            mock.patch.object(mlflow_env, "warn_dependency_requirement_mismatches", _no_warning)
            if hasattr(mlflow_env, "warn_dependency_requirement_mismatches")
            else nullcontext()
        )
        try:
            with _fluent_uri(self.uri), no_check:  # the flavour logs through the fluent API's store
                info = mlflow.pytorch.log_model(
                    model,
                    name="model",
                    signature=signature,
                    run_id=self._id,
                    model_id=logged.model_id,
                    code_paths=[str(interface.code_dir)],
                    serialization_format="pickle",
                    pip_requirements=interface.requirements,
                )
        finally:
            flavour_log.setLevel(level)
        return str(info.model_uri)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self._id, str(path), artifact_path)

    def log_text(self, text: str, name: str) -> None:
        self.client.log_text(self._id, text, name)

    def log_dict(self, data: Any, name: str) -> None:
        self.client.log_dict(self._id, data, name)

    def start_system_metrics(self, interval_s: float) -> None:
        """Sample MLflow's system metrics (CPU, memory, disk, network, GPU) into memory.

        Nothing reaches the store while sampling (MLflow's own monitor thread writes and
        reads the store every interval, which would put store traffic inside the timed
        region); ``flush_system_metrics`` logs the samples, with their times, afterwards."""
        self._monitor: SystemSampler | None = SystemSampler(interval_s, self.uri)
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
        items = [
            Metric(f"system/{k}", float(v), ts, step)
            for step, (ts, sample) in enumerate(monitor.samples)
            for k, v in sample.items()
        ]
        for i in range(0, len(items), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self._id, metrics=items[i : i + MAX_METRICS_PER_BATCH])

    def finish(self) -> None:
        self.client.set_terminated(self._id, "FINISHED")
        interrupts.untrack_run(self._id)

    def fail(self, error: BaseException) -> None:
        """End the run FAILED (KILLED for interrupts), with the error recorded."""
        if self.run_id is None:
            return
        # Prefect turns SIGTERM inside a flow into its TerminationSignal (an ExternalSignal).
        killed = isinstance(error, KeyboardInterrupt | SystemExit) or any(
            c.__name__ == "ExternalSignal" for c in type(error).__mro__
        )
        interrupts.untrack_run(self.run_id)
        try:
            self.stop_system_metrics()
            # The error may quote a URI with its secret (a database's or a server's message).
            self.set_tags({"relflow.error": mask_secrets(f"{type(error).__name__}: {error}")})
            self.log_text(mask_secrets("".join(traceback.format_exception(error))), "error.txt")
        finally:
            self.client.set_terminated(self._id, "KILLED" if killed else "FAILED")

    def reopen(self, run_id: str) -> str:
        """Continue an existing run of this experiment (a resumed sweep's parent): RUNNING again."""
        self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        self.set_tags(liveness.process_tags())  # this process holds it now
        interrupts.track_run(run_id, self)
        return run_id


DATASET_RACE_ATTEMPTS = 3


def _dataset_race(err: Exception) -> bool:
    """The unique-key failure of a dataset two runs inserted at once (PostgreSQL or SQLite)."""
    text = str(err)
    return "dataset_pk" in text or "UNIQUE constraint failed: datasets." in text
