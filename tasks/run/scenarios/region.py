"""The timed region of a run, every second in one named bucket (issue 19).

    list keys -> train (here, or DDP ranks under torchrun) -> calibration fit
        -> serving backend -> request scenario | predict passes

``run_region`` runs those steps over a ``Workload`` with the chain's clock and splits the
region's wall time into named buckets that add up to it exactly:

- ``stage``: the stage table's seconds (both phases; what e2e is made of);
- ``engine_setup``: building the model (``Chain.engine_setup_seconds``), with the untimed
  encoding fit a request scenario without a checkpoint needs first;
- ``calibration_fit``, ``backend_setup``: those steps, less any stage or engine seconds
  inside them;
- ``request_wait``: a server scenario's idle waits for arrivals and batch fill;
- ``request_settle``: a request scenario's bookkeeping of its served calls (``settle``: the
  figures, stage table and quality each call counts), run outside every request's span;
- ``distributed_launch``: torchrun start-up, the reference run and the ranks' wall time that
  is not in their stage seconds;
- ``orchestration``: the rest, i.e. Prefect task calls and bookkeeping only.

A bucket's time is measured *exclusive* of the seconds other buckets name inside it, so
nothing is counted twice; ``orchestration`` is what is left, never clamped (a negative one
would show a double count instead of hiding it). ``run_region`` returns them, with the
collector's pauses inside the region, as a ``RegionReport`` (tasks/measure/records.py), with
the stage table as the region left it (``StageReport``), what the workload read and laid out
(``DataReport``) and the scenario's report (``RegionRun``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from tasks.measure.gcpauses import GcPauses, frozen_collector
from tasks.measure.projection import Projections
from tasks.measure.records import CalibrationFit, DataReport, RegionReport, StageReport, TrainingReport
from tasks.run.backend_setup import Served
from tasks.run.scenarios.latency import LatencyRecord
from tasks.run.scenarios.offline import OfflineRun, run_offline
from tasks.run.scenarios.pricing import Pricing
from tasks.run.scenarios.workload import Workload
from tasks.stages.write import PredictionWriter

BUCKETS = ("calibration_fit", "backend_setup", "request_wait", "request_settle", "distributed_launch")


@dataclass
class Region:
    """The timed region's seconds by bucket while it runs (stage and engine seconds read from
    the workload); ``report`` is what it returns."""

    work: Workload
    seconds: float = 0.0
    named: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    gc: GcPauses = field(default_factory=GcPauses)  # collector pauses inside the region, any bucket

    def _elsewhere(self) -> float:
        """Seconds already named outside the bucket being measured."""
        return self.stage_seconds + self.work.chain.engine_setup_seconds + sum(self.named.values())

    @property
    def stage_seconds(self) -> float:
        return self.work.stages.timed_seconds

    @contextmanager
    def bucket(self, name: str) -> Iterator[None]:
        """Time the block into ``name``, less what other buckets name inside it."""
        before = self._elsewhere()
        with self.work.chain.clock.measure() as span:
            yield
        self.named[name] += span.seconds - (self._elsewhere() - before)

    def report(self) -> RegionReport:
        """The region's figures as they stand (run_region returns them when it ends)."""
        return RegionReport(
            seconds=self.seconds,
            stage_seconds=self.stage_seconds,
            engine_setup_seconds=self.work.chain.engine_setup_seconds,
            calibration_fit_seconds=self.named["calibration_fit"],
            backend_setup_seconds=self.named["backend_setup"],
            request_wait_seconds=self.named["request_wait"],
            request_settle_seconds=self.named["request_settle"],
            distributed_launch_seconds=self.named["distributed_launch"],
            gc=self.gc,
        )


@dataclass(kw_only=True)
class RegionSteps:
    """The region's steps that the caller (the flow) supplies: how training runs (here or DDP),
    how the serving backend starts, and the request scenario as a Prefect task (None: offline,
    whose predict passes run from here, tasks/run/scenarios/offline.py ``run_offline``, into
    ``writer``)."""

    train: Callable[[], TrainingReport]
    distributed: bool
    serving_backend: Callable[[], Served]
    requests: Callable[[], LatencyRecord] | None
    writer: PredictionWriter  # the run's prediction file (offline: the last pass writes it)


@dataclass(frozen=True)
class RegionRun:
    """What the timed region returns, each report taken when it ends."""

    timed: RegionReport  # its seconds by bucket, and the collector's pauses
    stages: StageReport  # the stage table, both phases
    data: DataReport  # what the workload read and laid out
    scenario: LatencyRecord | OfflineRun  # the request record, or the offline passes'
    projections: Projections  # run.projected_seconds (tasks/run/scenarios/pricing.py)
    backend: Served  # the serving backend's set-up (tasks/run/backend_setup.py)
    training: TrainingReport | None = None  # train+predict runs: the training step's
    calibration: CalibrationFit | None = None  # ... and the temperature fit after it


def run_region(work: Workload, steps: RegionSteps, *, train: bool, repeats: int) -> RegionRun:
    """Run the timed region over ``work``; returns its reports (``RegionRun``)."""
    region = Region(work)
    report: LatencyRecord | OfflineRun
    training, fit, backend = None, None, Served()
    # The collect and freeze run before the region's clock starts (tasks/measure/gcpauses.py).
    # The progress counts, the projection and run.max_minutes (tasks/run/scenarios/pricing.py): from
    # the region's start, closed before anything after it (the output checks' untracked passes).
    with frozen_collector(work.chain.clock) as region.gc, work.chain.clock.measure() as span:
        work.pricing = pricing = Pricing(work, work.chain.clock)
        try:
            work.list_keys()
            if train:
                if steps.distributed:
                    with region.bucket("distributed_launch"):
                        training = steps.train()
                else:
                    training = steps.train()
                with region.bucket("calibration_fit"):
                    fit = work.fit_calibration()
            with region.bucket("backend_setup"):
                backend = steps.serving_backend()
            if steps.requests is not None:
                report = steps.requests()
                region.named["request_wait"] += report.wait_s
                region.named["request_settle"] += report.settle_s
            else:
                pricing.begin("predict")
                report = run_offline(work, steps.writer, repeats)
        finally:
            pricing.close()
            work.pricing = None
    region.seconds = span.seconds
    stages, data = work.stages.report(), work.data_report()
    return RegionRun(region.report(), stages, data, report, pricing.projections, backend, training, fit)
