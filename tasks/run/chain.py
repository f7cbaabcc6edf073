"""The stage chain: one typed object per plan that owns the order of work.

    read (a chunk's or a request's root keys) -> preprocess -> encode (text columns only)
        -> tensorize -> compute (the engine's backend) -> calibrate -> write

Every path that turns root keys into tensors or predictions goes through a ``Chain``:
training epochs, offline predict passes, the calibration fit, the reference pass, request
scenarios, DDP ranks and the benchmark scripts. A second hand-written copy of these steps
drifts (one once forgot the encode step, so text specs handed raw strings to tensorize).

Each step is run by a ``StageRunner``: the flow hands in one that runs the step as a Prefect
task (``tasks/`` never imports Prefect); the default runs it directly. Either way the step is
timed with the run's clock, and its seconds and rows go to a ``StageSink`` that the caller
chooses (the run's stage table, one request's step times, a DDP rank's totals). Without a
sink (``prepare_untimed``) a step is called directly and nothing is recorded: fitting and
reference passes are never stage time.

Who drives it: the workload (tasks/run/scenarios/workload.py: root keys in chunks, training epochs,
the calibration fit; DDP ranks run its epoch loop too) inside the timed region
(tasks/run/scenarios/region.py: list keys -> train -> fit -> serving backend -> offline passes,
tasks/run/scenarios/offline.py, or requests, tasks/run/scenarios/request.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

from model.arrow import Encoding
from model.schema import ModelSchema
from tasks.libraries import Library, library_for
from tasks.libraries.base import ModelSide, ReadsSources, Weights
from tasks.libraries.reference.engine import Engine
from tasks.measure.clock import Clock
from tasks.measure.records import EncodeUnit
from tasks.runtime import progress
from tasks.runtime.writes import named_write_errors
from tasks.sources.tables import Sources
from tasks.spec import Spec
from tasks.stages.calibrate import CalibrationQuality, calibrate_outputs, report_mask
from tasks.stages.engine import EngineBase, PredictOutputs
from tasks.stages.preprocess import Preprocessed, preprocess
from tasks.stages.retrieve import retrieve
from tasks.stages.tensorize import Chunk
from tasks.stages.write import PredictionWriter

__all__ = ["Chain", "Prepared", "StageRunner", "StageSink", "Weights", "run_directly"]

_T = TypeVar("_T")

StageSink = Callable[[str, float, int], None]
"""(stage, seconds, root rows) of one step, for the caller's own bookkeeping."""

Where = dict[str, int | str]
"""Where a step runs (chunk, phase, epoch, repeat), for the progress line."""


class StageRunner(Protocol):
    """Runs one named step and returns its result and its seconds on the run's clock."""

    def __call__(self, stage: str, step: Callable[[], _T], clock: Clock) -> tuple[_T, float]: ...


def run_directly(stage: str, step: Callable[[], _T], clock: Clock) -> tuple[_T, float]:
    """The default runner: the step in this thread, timed (the flow's runner adds a Prefect task)."""
    with clock.measure() as span:
        out = step()
    return out, span.seconds


@dataclass
class Prepared:
    """One chunk or request through read -> preprocess -> (encode) -> tensorize."""

    tz: Chunk
    bytes_read: int
    rows_read: int  # source rows over every table (root and branches)
    overflow_dropped: dict[str, int] = field(default_factory=dict)
    encoded: int = 0  # what the encode step turned into vectors, in ``encode_unit``
    arrow_bytes: int = 0  # Arrow bytes retrieve handed to preprocess (its input)
    encode_unit: EncodeUnit = "cells"  # text cells, or a library's strings (``Encoded.unit``)

    def stage_bytes(self) -> dict[str, int]:
        """Bytes per stage (``stage.<stage>.<phase>.bytes``, the floor ledger's rates): what
        retrieve read, the Arrow bytes preprocess got, the tensor bytes tensorize made. The one
        definition every path that prepares (chunks, requests, DDP ranks) adds up."""
        return {"retrieve": self.bytes_read, "preprocess": self.arrow_bytes, "tensorize": self.tz.produced_bytes}


class Chain:
    """The stage steps of one plan: its spec, sources, clock, the library's side and engine.

    The side (``model.library``'s, tasks/libraries) starts from ``weights`` (a checkpoint or
    bundle) or fits on the first chunk that reaches tensorize (inside that step's time, as a
    first fit is real work of the run); the engine is built as soon as the side can build it."""

    def __init__(
        self,
        spec: Spec,
        sources: Sources,
        device: torch.device,
        *,
        clock: Clock | None = None,
        weights: Weights | None = None,
        run_stage: StageRunner = run_directly,
        library: Library | None = None,
    ) -> None:
        self.spec, self.sources, self.device = spec, sources, device
        self.clock = clock or Clock(device)
        self.weights = weights or Weights()
        self.run_stage = run_stage
        self.temperature = self.weights.temperature
        self.calibration = CalibrationQuality(spec.task.kind, self.temperature)
        self.outputs = tuple(spec.task.outputs)
        # The model under test (model.library) brings its encode and tensorize steps and engine.
        # A run hands down the library its plan found (``Plan.library``); scripts and tests look it up.
        self.library = library if library is not None else library_for(spec)
        self.side: ModelSide = self.library.model_side(spec, device, self.weights)
        self.has_text = self.side.encodes  # an encode step of its own (the stage table's row)
        if isinstance(self.side, ReadsSources):  # contexts over whole tables (RT's rt_utils builder)
            self.side.read_sources(sources)
        self.engine: EngineBase | None = None
        self.engine_setup_seconds = 0.0  # building the model: its own figure, not a stage

    @property
    def prepare_stages(self) -> tuple[str, ...]:
        return ("retrieve", "preprocess", *(("encode",) if self.has_text else ()), "tensorize")

    # -- read -> preprocess -> (encode) -> tensorize -------------------------------------------

    def _steps(
        self, keys: np.ndarray, run: Callable[[str, Callable[[], Any], Callable[[Any], int]], Any], train: bool = False
    ) -> Prepared:
        spec = self.spec
        r = run("retrieve", lambda: retrieve(spec, self.sources, keys), lambda r: r.root_rows)
        pre: Preprocessed = run("preprocess", lambda: preprocess(spec, r), lambda p: p.root_rows)
        count, encoded = 0, None
        unit: EncodeUnit = "cells"
        if self.has_text:  # the application's encoder: text cells, or a library's strings
            encoded = run("encode", lambda: self.side.encode(pre, train), lambda e: e.encoded_rows)
            pre, count, unit = encoded.pre, encoded.count, encoded.unit
        tz: Chunk = run("tensorize", lambda: self.side.tensorize(pre, train, encoded), lambda t: t.tensorized_rows)
        arrow_bytes = sum(t.nbytes for t in r.tables.values())
        return Prepared(
            tz, r.bytes_read, sum(r.rows_read.values()), dict(pre.overflow_dropped), count, arrow_bytes, unit
        )

    def _timed(
        self, stage: str, step: Callable[[], _T], where: Where | None, runner: StageRunner | None = None
    ) -> tuple[_T, float]:
        if where is not None:  # the CLI's progress line names the chunk and stage
            progress.emit("stage", name=stage, **where)
        return (runner or self.run_stage)(stage, step, self.clock)

    def prepare(
        self, keys: np.ndarray, sink: StageSink, where: Where | None = None, runner: StageRunner | None = None
    ) -> Prepared:
        """The timed steps for ``keys``; each step's seconds and rows go to ``sink``. ``runner``
        overrides the chain's (requests run their steps directly: no Prefect task per request)."""

        def run(stage: str, step: Callable[[], Any], rows: Callable[[Any], int]) -> Any:
            out, seconds = self._timed(stage, step, where, runner)
            sink(stage, seconds, rows(out))
            return out

        prepared = self._steps(keys, run, train=where is not None and where.get("phase") == "train")
        self.ensure_engine()
        return prepared

    def prepare_untimed(self, keys: np.ndarray) -> Chunk:
        """The same steps outside every timing (calibration fit, reference pass, scripts)."""
        tz = self._steps(keys, lambda stage, step, rows: step()).tz
        self.ensure_engine()
        return tz

    def predict_untimed(self, keys: np.ndarray) -> tuple[Chunk, PredictOutputs]:
        """read .. compute -> calibrate for ``keys`` outside every timing and run figure, with
        the served engine, backend and temperature (the output check's offline pass); nothing
        is written."""
        tz = self.prepare_untimed(keys)
        engine = self._engine()
        with engine.untracked():
            outs = engine.predict(tz, self.outputs)
        return tz, calibrate_outputs(outs, self.temperature, self.spec.task.kind)

    # -- the engine -------------------------------------------------------------------------

    def ensure_engine(self) -> EngineBase | None:
        """The engine, built once the side can build it (after its fit, or from the weights)."""
        if self.engine is None:
            with self.clock.measure() as span:
                self.engine = self.side.engine(self.clock)
            if self.engine is not None:
                self.engine.temperature = self.temperature
                self.engine_setup_seconds += span.seconds
        return self.engine

    def ready_engine(self, first_keys: np.ndarray) -> EngineBase:
        """The engine before a request scenario: a run without a checkpoint fits its encoding on
        ``first_keys`` outside every timing (a pure speed run, as in the offline scenario)."""
        if self.ensure_engine() is None:  # the fit is part of setting the engine up (one region bucket)
            before = self.engine_setup_seconds
            with self.clock.measure() as span:
                self.prepare_untimed(first_keys)
            self.engine_setup_seconds += span.seconds - (self.engine_setup_seconds - before)
        engine = self.ensure_engine()
        assert engine is not None  # the fit above set the schema
        return engine

    def _engine(self) -> EngineBase:
        if self.engine is None:
            raise RuntimeError("compute before any chunk was prepared: the model's schema is unknown")
        return self.engine

    @property
    def encoding(self) -> Encoding | None:
        """The reference model's encoding (``ModelSide.reference_inputs``); None before its fit
        and for a library with inputs of its own."""
        inputs = self.side.reference_inputs()
        return inputs[0] if inputs is not None else None

    @property
    def schema(self) -> ModelSchema | None:
        """The reference model's schema, as ``encoding``."""
        inputs = self.side.reference_inputs()
        return inputs[1] if inputs is not None else None

    def reference_engine(self) -> Engine:
        """The engine of the reference model (paths only it has: DDP, the output check, its
        checkpoint format: ``ModelSide.reference_engine``); ``check_library`` refused those
        settings for the others."""
        self._engine()
        engine = self.side.reference_engine()
        if engine is None:
            raise RuntimeError(f"model.library {self.spec.model.library} reached a path of the reference model only")
        return engine

    def set_temperature(self, temperature: float) -> None:
        """The fitted output calibration: applied by ``calibrate``, saved with the checkpoint."""
        self.temperature = self.calibration.temperature = temperature
        if self.engine is not None:
            self.engine.temperature = temperature

    # -- compute -> calibrate -> write ------------------------------------------------------

    def train(self, tz: Chunk, sink: StageSink, where: Where | None = None) -> None:
        """One chunk of a training epoch (the compute stage of the train phase)."""
        engine = self._engine()
        _, seconds = self._timed("compute", lambda: engine.train(tz), where)
        sink("compute", seconds, int(tz.is_train.sum()))

    def serve(
        self,
        tz: Chunk,
        writer: PredictionWriter,
        sink: StageSink,
        where: Where | None = None,
        runner: StageRunner | None = None,
        later: list[Callable[[], None]] | None = None,
    ) -> PredictOutputs:
        """compute (predict) -> calibrate -> write for one prepared chunk or request.

        ``later``: the bookkeeping (what compute kept by reference: the batches' layouts and
        the quality's scores, ``engine.settle``; the calibration quality, whose ``report_mask``
        hashes every key) is appended there instead of run, for a caller that runs it outside
        its own timing (a request's latency span)."""
        engine, spec, rows = self._engine(), self.spec, tz.root_rows
        outs, seconds = self._timed("compute", lambda: engine.predict(tz, self.outputs), where, runner)
        sink("compute", seconds, rows)
        # counted here, outside the compute stage (and a request's latency): also bounds what
        # the engine holds by reference to one chunk's batches
        if later is None:
            engine.settle()
        else:
            later.append(engine.settle)
        if outs.label_mask is not None and outs.labels is not None:  # quality bookkeeping: untimed
            # only the rows the temperature was not fitted on (out-of-sample calibration quality);
            # the uncalibrated logits, by reference (calibrate replaces the dict's entry)
            logits, labels, mask, is_fit = outs.tensors["prediction"], outs.labels, outs.label_mask, tz.is_fit

            def score() -> None:
                self.calibration.add(logits, labels, report_mask(is_fit, mask))

            if later is None:
                score()
            else:
                later.append(score)
        t = self.temperature
        outs, seconds = self._timed("calibrate", lambda: calibrate_outputs(outs, t, spec.task.kind), None, runner)
        sink("calibrate", seconds, rows)

        def write() -> None:
            # A full disk is named (path and setting), on every path that writes predictions.
            with named_write_errors(writer.path, "predictions", "run.output_dir"):
                writer.write(engine.predictions_table(tz.keys, outs))

        _, seconds = self._timed("write", write, where, runner)
        sink("write", seconds, rows)
        return outs
