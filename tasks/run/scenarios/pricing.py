"""Know the price before paying it (issue 41, item 5): counts, the projection, run.max_minutes.

One ``Pricing`` per timed region (``run_region``). The workload and the scenarios tell it where
the run is: a phase begins (training epochs, the offline predict passes, a request run), a chunk
is prepared (its training rows become known), a batch or a request is done. It

- keeps the progress line's count (tasks/runtime/progress.py): batches done of a total known
  before the phase starts (every batch plan over ``n`` rows, the reference model's, relflow's
  and relational-transformers', by length or not, cuts ``ceil(n / run.batch_size)`` batches), a
  training total marked as an estimate until every chunk was split into training and held-out
  rows; a request run counts requests (single_stream: at least ``run.request.min_requests``);
- projects the timed region's duration once a phase has run ``STEADY_TO_PRICE`` steady batches
  (or steady requests), with tasks/measure/projection.py, and hands it to the display;
- stops the run with a ``UserError`` (exit 2) when a projection exceeds ``run.max_minutes``,
  naming the projection and the settings that drive it, before the work is spent.

Cost inside the timed loop: ``after_batch`` runs after each batch's timed step, inside the
compute stage: two integer additions and one comparison per batch, and the projection itself
(a few dozen float operations) at most once per phase. ``benchmarks/bench_progress.py`` prices
both against a steady batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.measure.clock import Clock
from tasks.measure.projection import PhaseLeft, Projection, Projections
from tasks.runtime import progress
from tasks.runtime.errors import UserError
from tasks.spec import Spec
from tasks.spec.schema import Branch

if TYPE_CHECKING:
    from tasks.run.scenarios.workload import Workload
    from tasks.stages.tensorize import Chunk

STEADY_TO_PRICE = 3  # steady batches (or steady requests) of a phase before it is priced


def batches_for(rows: int, batch_size: int) -> int:
    """Batches of a pass over ``rows`` rows (every batch plan cuts this many)."""
    return -(-rows // batch_size)


class Pricing:
    def __init__(self, work: Workload, clock: Clock) -> None:
        self.work, self.clock, self.spec = work, clock, work.spec
        self.start = clock.read()
        self.projections = Projections([])
        self.done: dict[str, int] = {"train": 0, "predict": 0}  # batches
        self.train_rows: dict[int, int] = {}  # chunk -> its training rows (known once prepared)
        self.priced: set[str] = set()
        self.requests_done = 0
        self.request_schedule_s: float | None = None  # server: the last arrival
        self._hooked: object = None

    # -- what the workload and scenarios report --------------------------------------------

    def begin(self, phase: str) -> None:
        """Training epochs or the offline predict passes start."""
        self._hook()
        total, exact = self.batches_total(phase)
        progress.begin(phase, total, exact=exact)

    def chunk_ready(self, i: int, phase: str, tz: Chunk) -> None:
        """Chunk ``i`` was prepared for ``phase``: its training rows are known; the engine exists."""
        self._hook()
        if phase == "train" and i not in self.train_rows:
            self.train_rows[i] = int(tz.is_train.sum())
            count = progress._count
            if count is not None and count.phase == "train":
                count.total, count.exact = self.batches_total("train")

    def after_batch(self, phase: str, rows: int) -> None:
        """After each timed batch (``EngineBase.after_batch``): count it; price the run once
        the phase has its first steady batches."""
        if phase == "predict" and self.spec.run.scenario != "offline":
            return  # a request run counts and prices its requests (``requests_served``)
        self.done[phase] += 1
        progress.tick(rows)
        if phase not in self.priced:
            engine = self.work.chain.engine
            timings = engine.train_timings if phase == "train" else engine.predict_timings  # type: ignore[union-attr]
            if len(timings.steady_seconds) >= STEADY_TO_PRICE:
                self.priced.add(phase)
                self.project(phase)

    def begin_requests(self, schedule_seconds: float | None, total: int) -> None:
        """A request run's schedule starts (after its cold request): ``total`` requests, all of
        them for the server (its schedule ends at ``schedule_seconds``), at least that many for
        single_stream."""
        self.request_schedule_s = schedule_seconds
        progress.begin(self.spec.run.scenario, total, exact=schedule_seconds is not None, unit="requests")

    def requests_served(self, requests: int, roots: int, elapsed: float) -> None:
        """``requests`` more were served, ``elapsed`` seconds into the schedule."""
        self.requests_done += requests
        progress.tick(roots, requests)
        scenario = self.spec.run.scenario
        if scenario not in self.priced and self.requests_done >= STEADY_TO_PRICE:
            self.priced.add(scenario)
            self.project(scenario, requests_left=self._requests_left(elapsed))

    def close(self) -> None:
        """The region is over: passes after it (the output checks) are not counted."""
        engine = self.work.chain.engine
        if engine is not None and engine.after_batch == self.after_batch:
            engine.after_batch = None
        progress.end()

    # -- counts ------------------------------------------------------------------------------

    def batches_total(self, phase: str) -> tuple[int, bool]:
        """Batches of the whole phase (every epoch, every pass), and whether that is exact."""
        run, chunks = self.spec.run, self.work.chunks
        if phase == "predict":
            return run.repeats * sum(batches_for(len(c), run.batch_size) for c in chunks), True
        known = sum(batches_for(n, run.batch_size) for n in self.train_rows.values())
        unknown = [len(c) for i, c in enumerate(chunks) if i not in self.train_rows]
        if unknown:  # not split yet: at the training share of the chunks split so far
            seen = sum(len(chunks[i]) for i in self.train_rows)
            share = sum(self.train_rows.values()) / seen if seen else 1.0 - self.spec.task.validation_fraction
            known += sum(batches_for(round(n * share), run.batch_size) for n in unknown)
        return run.epochs * known, not unknown

    # -- the projection ----------------------------------------------------------------------

    def project(self, at: str, requests_left: PhaseLeft | None = None) -> Projection:
        """Project the region from here; stop the run when it exceeds ``run.max_minutes``."""
        elapsed = self.clock.read() - self.start
        phases: list[PhaseLeft] = []
        run = self.spec.run
        if at == "train":
            phases.append(self._phase_left("train"))
        if run.scenario == "offline" and at in ("train", "predict"):
            phases.append(self._phase_left("predict"))
        elif requests_left is not None:
            phases.append(requests_left)
        elif run.scenario != "offline":
            req = run.request
            at_least = req.min_duration_s
            if run.scenario == "server":
                at_least = max(at_least, req.min_requests / req.target_qps)
            phases.append(
                PhaseLeft(
                    run.scenario,
                    schedule_seconds=at_least,
                    priced_by="at least its schedule: run.request.min_duration_s, min_requests / target_qps",
                )
            )
        projection = Projection(at, elapsed, tuple(phases))
        self.projections.made.append(projection)
        progress.emit("projection", text=projection.describe(), seconds=projection.total_seconds)
        if run.max_minutes is not None and projection.total_seconds > run.max_minutes * 60:
            raise UserError(self.over_budget(projection))
        return projection

    def _phase_left(self, phase: str) -> PhaseLeft:
        """``phase``'s batches and stage rows left, at its own measured rates (predict before
        it ran: training's)."""
        chain, work = self.work.chain, self.work
        engine = chain.engine
        assert engine is not None  # a batch ran
        total, exact = self.batches_total(phase)
        own = (engine.train_timings if phase == "train" else engine.predict_timings).steady_seconds
        stand_in = not own
        steady = engine.train_timings.steady_seconds if stand_in else own
        per_batch = sum(steady) / len(steady) if steady else 0.0
        stages = list(chain.prepare_stages) + (["calibrate", "write"] if phase == "predict" else [])
        rows_each = work.root_rows_to_prepare(phase)
        left_rows: list[tuple[int, float]] = []
        for stage in stages:
            timing = work.stages[phase][stage]
            measured = timing if timing.rows else work.stages["train"].get(stage)
            rate = measured.seconds / measured.rows if measured is not None and measured.rows else 0.0
            left_rows.append((max(rows_each - timing.rows, 0), rate))
        rows_left = max((n for n, _ in left_rows), default=0)
        stage_seconds = sum(n * rate for n, rate in left_rows)
        return PhaseLeft(
            phase,
            batches_left=max(total - self.done[phase], 0),
            seconds_per_batch=per_batch,
            rows_left=rows_left,
            seconds_per_row=stage_seconds / rows_left if rows_left else 0.0,
            exact=exact,
            priced_by=(
                "at training's steady batches and stage rates (a forward and backward; no write measured yet)"
                if stand_in
                else f"at its own {len(own)} steady batches"
            ),
        )

    def _requests_left(self, elapsed: float) -> PhaseLeft:
        run = self.spec.run
        if self.request_schedule_s is not None:  # server: its schedule runs to the last arrival
            return PhaseLeft(
                run.scenario,
                schedule_seconds=max(self.request_schedule_s - elapsed, 0.0),
                priced_by="its schedule's last arrival",
            )
        req = run.request
        per = elapsed / self.requests_done if self.requests_done else 0.0
        left = max((req.min_requests - self.requests_done) * per, req.min_duration_s - elapsed, 0.0)
        return PhaseLeft(
            run.scenario,
            schedule_seconds=left,
            priced_by=f"run.request.min_requests and min_duration_s at {per * 1e3:,.2f} ms a request",
        )

    def _hook(self) -> None:
        engine = self.work.chain.engine
        if engine is not None and engine is not self._hooked:
            engine.after_batch = self.after_batch
            self._hooked = engine

    # -- the message -------------------------------------------------------------------------

    def over_budget(self, p: Projection) -> str:
        run, work = self.spec.run, self.work
        drivers = []
        train_total, _ = self.batches_total("train")
        if run.mode == "train+predict" and not run.distributed:
            drivers.append(
                f"run.epochs {run.epochs} x {train_total // max(run.epochs, 1):,} training batches of "
                f"run.batch_size {run.batch_size}"
            )
        if run.scenario == "offline":
            drivers.append(
                f"run.repeats {run.repeats} predict passes of "
                f"{self.batches_total('predict')[0] // run.repeats:,} batches of run.batch_size {run.batch_size} "
                f"over {work.data.root_rows:,} root rows"
            )
        else:
            drivers.append(
                f"run.request.min_requests {run.request.min_requests} and "
                f"run.request.min_duration_s {run.request.min_duration_s:g}"
            )
        prepared = work.stages["predict"]["tensorize"].rows + work.stages["train"]["tensorize"].rows
        cells = work.data.coords_present / prepared if prepared else 0.0
        lengths = ", ".join(f"{name}.max_length {n}" for name, n in _max_lengths(self.spec))
        drivers.append(f"{cells:,.1f} present cells per root row so far" + (f" (schema: {lengths})" if lengths else ""))
        return (
            f"run.max_minutes is {run.max_minutes:g} but this run is {p.describe()}, priced after "
            f"{STEADY_TO_PRICE} steady {p.at} batches. What drives it: " + "; ".join(drivers) + ". Lower one "
            "of those (or the data's scale), or raise run.max_minutes (null turns the limit off). The run stopped "
            "before spending it: its partial outputs were removed and its MLflow run ended FAILED."
        )


def _max_lengths(spec: Spec) -> list[tuple[str, int]]:
    """Every branch's reserved length, depth first (the cells a root row can have)."""
    out: list[tuple[str, int]] = []

    def visit(branches: list[Branch]) -> None:
        for b in branches:
            out.append((b.name, b.max_length))
            visit(b.branches)

    visit(spec.schema_.branches)
    return out
