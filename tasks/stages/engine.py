"""What every model under test's compute engine shares: the harness's bookkeeping.

A library's engine (one per library under ``tasks/libraries/``, the reference model's
included) supplies the model's own steps (batches, a train step, a predict step);
this base owns the figures those steps produce, so every library reports them the same way:
per-phase batch timings split into first call, warm-up and steady state
(``PhaseTimings``), the product's throughput estimate next to the exact rows, quality over
held-out rows, Dynamo frames and graph breaks charged to the phase whose batch caused them,
the wait for input, and the profiler over a few steady batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
import torch

# Dynamo's counters, imported here (~1 s) so that the import lands in harness start-up, not in
# the timed region the first engine is built in.
from torch._dynamo.utils import counters

from model.throughput import Logger, ThroughputCallback
from tasks.measure import keys as K
from tasks.measure.cell_flops import CellMoments, FlopModel
from tasks.measure.clock import Clock, Window
from tasks.measure.profiling import SteadyProfiler
from tasks.measure.quality import Quality
from tasks.measure.records import PhaseTimings
from tasks.spec import Spec

_P = TypeVar("_P")  # one device batch of the library's own type

Layout = tuple[int, int, tuple[int, ...]]
"""(present, padded) coordinates a predict batch gave the model, and its padded shape."""

if TYPE_CHECKING:
    from tasks.stages.tensorize import Chunk


def compiled_frames() -> int:
    """Graphs Dynamo has compiled so far in this process (each recompile adds one).

    ``counters["frames"]["ok"]`` is not counted for ``fullgraph=True`` regions in torch 2.13
    (it stayed 0 through real recompiles, so every run reported 0); ``unique_graphs`` is."""
    return int(counters["stats"]["unique_graphs"])


def compile_cache_counts() -> tuple[int, int]:
    """(hits, misses) of Inductor's FX-graph cache and AOTAutograd's cache so far in this
    process. Both live on disk (``TORCHINDUCTOR_CACHE_DIR``, by default one folder shared by
    every run of the user), so a compile another run already did comes back in a fraction of
    its cold time: a first call is a cold compile only where the hits are 0."""
    hits = counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"]
    misses = counters["inductor"]["fxgraph_cache_miss"] + counters["aot_autograd"]["autograd_cache_miss"]
    return int(hits), int(misses)


def graph_breaks() -> int:
    return int(sum(counters["graph_break"].values()))


def graph_break_reasons() -> dict[str, int]:
    """Dynamo's graph-break reasons so far in this process, with counts."""
    return {str(k): int(v) for k, v in counters["graph_break"].items()}


@dataclass
class PredictOutputs:
    """Selected outputs of one chunk, on CPU, aligned with the chunk's root rows."""

    tensors: dict[str, torch.Tensor]
    present: dict[str, torch.Tensor] = field(default_factory=dict)  # node name -> present mask
    labels: torch.Tensor | None = None  # target labels, aligned with the prediction
    label_mask: torch.Tensor | None = None  # held-out, labelled cells (quality counts these)


@dataclass(frozen=True)
class ModelFacts:
    """What a model under test says about itself after the run, for the run record."""

    library: str
    parameters: int
    flops_per_root_row: int | None  # reserved shapes, predict outputs; None: see flops_note
    flops_note: str = ""  # why no FLOPs (and so no MFU) are published, when there are none
    tags: dict[str, str] = field(default_factory=dict)  # relflow.<library>.* facts
    metrics: dict[str, float] = field(default_factory=dict)  # library figures (compile, packing, ...)
    # A model over padded contexts of cells: FLOPs by padded length (tasks/measure/cell_flops.py),
    # which with ``EngineBase.steady_cells`` gives the steady batches' present and padded FLOPs.
    flop_model: FlopModel | None = None


class EngineBase:
    """The harness's bookkeeping around a model's steps; a "part" is one device batch, of
    whatever type the library's steps take."""

    def __init__(self, spec: Spec, device: torch.device, clock: Clock | None) -> None:
        self.spec, self.device = spec, device
        self.temperature = 1.0  # output calibration, saved with the checkpoint
        self.clock = clock or Clock(device)
        bs, wu = spec.run.batch_size, spec.run.warmup_batches
        self.train_timings = PhaseTimings(wu)
        self.predict_timings = PhaseTimings(wu)
        # The product's throughput callback: its batches x batch size estimate, steady batches only.
        self.throughput = {
            phase: ThroughputCallback(bs, K.compute(phase, K.ESTIMATED_ROWS_PER_S)) for phase in K.PHASES
        }
        self.wall_seconds = 0.0
        self.paths_seen: set[str] = set()
        self.quality = self.new_quality()
        # Dynamo frames compiled (and graph breaks) while a phase's own steady batches ran:
        # a recompile is charged to the phase whose batch triggered it, never to the other.
        self.frames_at_start = compiled_frames()
        self.compile_cache_at_start = compile_cache_counts()
        self.steady_frames: dict[str, int] = {"train": 0, "predict": 0}
        self.steady_breaks: dict[str, int] = {"train": 0, "predict": 0}
        # Breaks while a phase compiled (first call and warm-up batches): a whole-model
        # compile's breaks show here, since they happen before the steady window.
        self.warmup_breaks: dict[str, int] = {"train": 0, "predict": 0}
        self.worker_startup_seconds = 0.0
        self.profiler = SteadyProfiler(spec.run.profile, spec.run.profile_batches, device)
        self._batch_coords: list[tuple[int, int]] = []  # (present, padded) per predict batch
        self._batch_shapes: set[tuple[int, ...]] = set()  # padded shapes seen (predict)
        # Each predict batch's layout, kept by reference inside the timed loop (``keep_layout``:
        # masks, no reduction) and counted by ``settle``, outside the compute stage: counting
        # inside it (relflow walks every field; a host copy per node on CUDA) was charged to
        # compute seconds, e2e and every request's latency (issue 43 item 11).
        self._kept_layouts: list[Callable[[], Layout]] = []
        # steady predict batches' padding masks of a cell-context library, by reference: summed
        # when read (``steady_cells``), after the timed region, not per batch inside it
        self.steady_cell_masks: list[torch.Tensor] = []
        # Called with (phase, root rows) after each timed batch (tasks/run/scenarios/pricing.py:
        # the progress count and the run's projection); None outside a timed region.
        self.after_batch: Callable[[str, int], None] | None = None

    def keep_layout(self, count: Callable[[], Layout]) -> None:
        """Inside the timed loop: one predict batch's layout, as a call over references to its
        masks that ``settle`` makes later (it must not hold the batch's inputs)."""
        self._kept_layouts.append(count)

    def settle(self) -> None:
        """Count what the timed loops kept by reference: the predict batches' layouts
        (``batch_coords``, ``batch_shapes``) and the quality's scores. The chain calls it after
        each compute stage (a request's: with the bookkeeping it runs outside the request's
        latency); reading a figure calls it too."""
        kept, self._kept_layouts = self._kept_layouts, []
        for count in kept:
            present, padded, shape = count()
            self._batch_coords.append((present, padded))
            self._batch_shapes.add(shape)
        self.quality.settle()

    @property
    def batch_coords(self) -> list[tuple[int, int]]:
        """(present, padded) coordinates per predict batch (``data.padded_coords``)."""
        self.settle()
        return self._batch_coords

    @property
    def batch_shapes(self) -> set[tuple[int, ...]]:
        """Distinct padded shapes the predict batches had (``data.batch_shapes``)."""
        self.settle()
        return self._batch_shapes

    @property
    def steady_cells(self) -> CellMoments:
        """The steady predict batches' cell sums (tasks/measure/cell_flops.py)."""
        cells = CellMoments()
        for mask in self.steady_cell_masks:
            cells.add(mask)
        return cells

    # -- what a library's engine supplies -------------------------------------------------

    def new_quality(self) -> Quality:
        """Quality in the target's own units."""
        return Quality(self.spec.task.kind)

    def train(self, tz: Chunk) -> None:
        raise NotImplementedError

    def predict(self, tz: Chunk, outputs: tuple[str, ...]) -> PredictOutputs:
        raise NotImplementedError

    def validation_logits(self, tz: Chunk, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw prediction logits and labels of ``rows``' labelled cells, outside every timing."""
        raise NotImplementedError

    def predictions_table(self, keys: pa.Array, outs: PredictOutputs) -> pa.Table:
        """The write stage's table: one row per root key, the selected outputs."""
        raise NotImplementedError

    def facts(self) -> ModelFacts:
        raise NotImplementedError

    def save_checkpoint(self, path: Path, spec: Spec) -> None:
        """The trained weights and what rebuilding the model needs, written atomically;
        ``spec`` is the run's configured spec (its hash is the run's ``relflow.spec_hash``)."""
        raise NotImplementedError

    def target_present(self, outs: PredictOutputs) -> torch.Tensor:
        """The target's present mask, broadcast to the prediction (a root target: every row)."""
        pred = outs.tensors["prediction"]
        mask = torch.ones(pred.shape[0], dtype=torch.bool)
        return mask.reshape(-1, *([1] * (pred.dim() - 1))).expand_as(pred)

    def end_epoch(self) -> None:
        """Called after each training epoch (every chunk trained once)."""

    def steady_batch(self, phase: str, part: Any) -> None:
        """Called for each steady batch after its step (outside its timed span)."""

    def present_flops(self, phase: str) -> tuple[float, float] | None:
        """``phase``'s forward FLOPs per root row at the reserved shapes, and its steady batches'
        FLOPs at each root's present shape, for an engine that counts its batches' shapes (the
        reference model's: ``compute.mfu`` per phase); None where it does not."""
        return None

    # -- the harness's side ---------------------------------------------------------------

    def begin_predict_pass(self) -> None:
        """Quality is scored on one pass (the latest), not accumulated over repeats."""
        self.quality = self.new_quality()

    @contextmanager
    def untracked(self) -> Iterator[None]:
        """Predict calls inside leave every run figure as it was (the output check's offline
        pass, after the timed region): no batch is steady (so no throughput, FLOPs shape,
        recompile or profile is charged), and the timings, coordinates, quality and wall
        time are put back after."""
        saved = (
            self.predict_timings,
            self._batch_coords,
            self._batch_shapes,
            self._kept_layouts,
            self.quality,
            self.wall_seconds,
        )
        paths, breaks = set(self.paths_seen), dict(self.warmup_breaks)
        self.predict_timings = PhaseTimings(2**62)  # warm-up never ends: nothing is steady
        self._batch_coords, self._batch_shapes, self._kept_layouts = [], set(), []
        self.quality = self.new_quality()
        try:
            yield
        finally:
            (
                self.predict_timings,
                self._batch_coords,
                self._batch_shapes,
                self._kept_layouts,
                self.quality,
                self.wall_seconds,
            ) = saved
            self.paths_seen, self.warmup_breaks = paths, breaks

    def record(self, phase: str, t: PhaseTimings, seconds: float, rows: int, part: object) -> None:
        """One batch's step seconds (the window's span callback)."""
        if t.in_steady_state:
            self.throughput[phase].on_batch_end(seconds)
        t.record(seconds, rows)

    def timed_batches(
        self, phase: str, t: PhaseTimings, batches: Iterator[tuple[_P, int]], window: Window
    ) -> Iterator[tuple[_P, int]]:
        """Yield batches, charging the wait for each one to ``t.input_seconds`` (through the
        loop's ``window``: on CUDA, at its next flush), and Dynamo's frames and breaks to the
        phase (steady or warm-up) of the batch whose step caused them."""

        def waited(seconds: float) -> None:
            t.input_seconds += seconds

        while True:
            steady = t.in_steady_state
            frames, breaks = compiled_frames(), graph_breaks()
            with window.span(waited):
                item = next(batches, None)
            if item is None:
                return
            yield item  # the caller runs the step before asking for the next batch
            if steady:
                self.steady_frames[phase] += compiled_frames() - frames
                self.steady_breaks[phase] += graph_breaks() - breaks
                self.steady_batch(phase, item[0])
            else:
                self.warmup_breaks[phase] += graph_breaks() - breaks
            if self.after_batch is not None:  # outside the batch's span: a count, rarely a projection
                self.after_batch(phase, item[1])

    def flush_throughput(self, logger: Logger) -> dict[str, float]:
        """Send each phase's callback estimate to ``logger`` (phases that ran steady batches);
        returns what was sent."""
        sent: dict[str, float] = {}
        for cb in self.throughput.values():
            if cb.batches:
                cb.logger = logger
                sent.update(cb.flush())
        return sent

    def recompiles(self, phase: str) -> int:
        return self.steady_frames[phase]

    def graph_breaks_after_warmup(self, phase: str) -> int:
        return self.steady_breaks[phase]

    def graph_breaks_in_warmup(self, phase: str) -> int:
        """Breaks while the phase compiled (first call and warm-up batches)."""
        return self.warmup_breaks[phase]

    def close(self) -> None:
        """Release what the engine started (loader workers)."""

    def backend_tags(self) -> dict[str, Any]:
        """Tags of what served the predict steps."""
        return {}

    def session_threads(self) -> int | None:
        """The intra-op threads the predict steps ran at when what served them has a session
        that fixed its own when it was created (ONNX Runtime: tasks/backends/__init__.py);
        None when they ran on torch's, whatever those were (the process's, or a request
        scenario's ``run.request.intra_op_threads``). Asked after the timed region: the
        run's MFU peak and floors are at this count (``invocation.predict_threads``)."""
        return None
