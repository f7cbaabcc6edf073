"""One benchmark invocation's state, handed from step to step of the flow.

``flows/benchmark.py`` orders the steps (plan -> start the run -> the timed region -> collect
-> judge -> log); each step reads and fills this record: the plan and the spec, the MLflow run,
the prediction file, the workload and its timed region, the request scenario's record, the
serving backend's set-up. The steps themselves live where a reader expects them:
``tasks/run/record/assemble.py`` (collect), ``tasks/run/record/judge.py`` (judge),
``tasks/run/record/run_log.py`` (log).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tasks.measure.memory import PeakMemory
from tasks.measure.records import BackendSetup, Region, RegionReport, RunResult
from tasks.run.checks.plan import Plan
from tasks.run.scenarios.latency import LatencyRecord
from tasks.run.scenarios.outputs import OutputCheck
from tasks.run.scenarios.workload import Workload
from tasks.spec import Spec
from tasks.stages.engine import EngineBase
from tasks.stages.write import PredictionWriter
from tasks.tracking.writer import Tracker


@dataclass(kw_only=True)
class Invocation:
    """One benchmark invocation's state, handed from step to step."""

    spec: Spec
    plan: Plan
    tracker: Tracker
    run_id: str
    output: Path
    writer: PredictionWriter
    result: RunResult
    memory: PeakMemory
    flow_start: float
    launch_seconds: float  # from the CLI's launch to the flow's start (Prefect start-up)
    mlflow_seconds: float
    work: Workload | None = None
    region: Region | None = None  # the host around the timed region (lock wait, bounds, load)
    timed: RegionReport | None = None  # the timed region by bucket, and the collector's pauses inside it
    # Steps that went through a Prefect task (the flow's stage runner and the requests task):
    # the orchestration floor's calls. Requests run their steps directly, so the stage table's
    # call counts are not Prefect calls.
    prefect_calls: int = 0
    ckpt_path: Path | None = None
    latency: LatencyRecord | None = None  # a single_stream / server run's
    backend_setup: BackendSetup = field(default_factory=BackendSetup)
    backend_tags: dict[str, str] = field(default_factory=dict)
    reference_quality: dict[str, float] | None = None
    output_check: OutputCheck | None = None  # run.check_outputs (offline)

    @property
    def quality_meaningful(self) -> bool:
        trained = self.plan.checkpoint is not None or (  # a library's checkpoint is its own to load
            self.plan.library.own_checkpoint and self.spec.run.checkpoint is not None
        )
        return self.spec.run.mode == "train+predict" or trained

    @property
    def engine(self) -> EngineBase:
        """The model under test's engine (after the timed region built it)."""
        assert self.work is not None and self.work.chain.engine is not None  # after the timed body
        return self.work.chain.engine

    @property
    def predict_threads(self) -> int | None:
        """The intra-op threads the predict compute ran at when they were not simply the
        process's torch count; the one count the run's predict MFU peak
        (``compute.predict.request_peak_flops_per_s``) and its floor ledger use, logged as
        ``compute.predict.intra_op_threads``. A session that fixed its own when it was created
        (ONNX Runtime, ``EngineBase.session_threads``) ran at those, whatever torch's were
        then; otherwise a request scenario's torch count while serving
        (``run.request.intra_op_threads``, read back as ``latency.intra_op_threads``)."""
        own = self.engine.session_threads()
        if own is not None:
            return own
        if self.latency is None or not self.latency.intra_op_threads:
            return None
        return self.latency.intra_op_threads
