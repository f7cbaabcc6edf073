"""One benchmark invocation, and what its timed body returns.

``flows/benchmark.py`` orders the steps (plan -> start the run -> the timed body -> collect
-> judge -> log). ``Invocation`` is the invocation's identity and plan (the spec, the plan,
the MLflow run id, the prediction file) and the live handles its steps share (the MLflow run,
the prediction writer, the memory sampler, the workload the region built); it holds no
figures. What a step measures it returns: the timed body a ``Timed`` (the region's reports,
the host around it, the checks after it), collect the ``RunResult``
(``tasks/run/record/assemble.py``), which judge (``tasks/run/record/judge.py``) and log
(``tasks/run/record/run_log.py``) read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tasks.measure.memory import PeakMemory
from tasks.measure.records import Region
from tasks.run.checks.plan import Plan
from tasks.run.scenarios.latency import LatencyRecord
from tasks.run.scenarios.offline import OfflineRun
from tasks.run.scenarios.outputs import OutputCheck
from tasks.run.scenarios.region import RegionRun
from tasks.run.scenarios.workload import Workload
from tasks.spec import Spec
from tasks.stages.engine import EngineBase
from tasks.stages.write import PredictionWriter
from tasks.tracking.writer import Tracker


@dataclass(kw_only=True)
class Invocation:
    """One benchmark invocation: its identity and plan, and the handles its steps share."""

    spec: Spec
    plan: Plan
    tracker: Tracker
    run_id: str
    output: Path
    writer: PredictionWriter
    memory: PeakMemory
    flow_start: float
    launch_seconds: float  # from the CLI's launch to the flow's start (Prefect start-up)
    mlflow_seconds: float
    work: Workload | None = None  # the workload the timed body built (its chain and engine)

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


@dataclass(frozen=True)
class Timed:
    """What the timed body returns (flows/benchmark.py ``timed_body``): the region's reports, the
    host around it, the Prefect task calls it made, and the checks run after it, untimed."""

    ran: RegionRun
    host: Region  # lock wait, the region's bounds, host load
    # Steps that went through a Prefect task (the flow's stage runner and the requests task):
    # the orchestration floor's calls. Requests run their steps directly, so the stage table's
    # call counts are not Prefect calls.
    prefect_calls: int
    output_check: OutputCheck | None = None  # run.check_outputs (offline; a request run's is its record's)
    reference_quality: dict[str, float] | None = None  # the reference checkpoint's, by quality figure

    @property
    def latency(self) -> LatencyRecord | None:
        """A single_stream / server run's record."""
        return self.ran.scenario if isinstance(self.ran.scenario, LatencyRecord) else None

    @property
    def offline(self) -> OfflineRun | None:
        return self.ran.scenario if isinstance(self.ran.scenario, OfflineRun) else None


def predict_threads(engine: EngineBase, latency: LatencyRecord | None) -> int | None:
    """The intra-op threads the predict compute ran at when they were not simply the process's
    torch count; the one count the run's predict MFU peak
    (``compute.predict.request_peak_flops_per_s``) and its floor ledger use, logged as
    ``compute.predict.intra_op_threads``. A session that fixed its own when it was created (ONNX
    Runtime, ``EngineBase.session_threads``) ran at those, whatever torch's were then; otherwise
    a request scenario's torch count while serving (``run.request.intra_op_threads``, read back
    from its record as ``latency.intra_op_threads``)."""
    own = engine.session_threads()
    if own is not None:
        return own
    if latency is None or not latency.intra_op_threads:
        return None
    return latency.intra_op_threads
