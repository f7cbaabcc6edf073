"""One run's work over its root keys: chunks, training epochs, the calibration fit.

A ``Workload`` lists the root keys once (charged to predict's retrieve), cuts them into
``run.chunk_rows`` chunks, and drives the plan's ``Chain`` (tasks/run/chain.py) over them:
training epochs here, predict passes in the scenarios (offline.py, runner.py). Every stage
second is charged to the phase that spent it, in the workload's stage table (``stages``, a
``StageTable``), and what it read and laid out in its ``data`` (a ``DataTally``); the region
returns their reports (``data_report``); the scenarios return their own figures.

With one chunk, training keeps its tensors between epochs (a streaming trainer re-reads
chunks; a workload that fits in one chunk need not); predict passes always run every stage,
so each pass is a full, comparable measurement of the serving path.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from tasks.measure.records import CalibrationFit, DataReport, DataTally, StageTable, TrainingReport
from tasks.run.chain import Chain, Prepared, StageSink
from tasks.stages.calibrate import CALIBRATED_KINDS, fit_errors, fit_temperature, validation_logits
from tasks.stages.retrieve import list_root_keys
from tasks.stages.tensorize import Chunk


class Listener(Protocol):
    """What the workload and the request runner tell the timed region's progress and projection
    (tasks/run/scenarios/pricing.py ``Pricing``, which reads the workload: declared here, not
    imported, so the two modules do not import each other)."""

    def begin(self, phase: str) -> None: ...

    def chunk_ready(self, i: int, phase: str, tz: Chunk) -> None: ...

    def begin_requests(self, schedule_seconds: float | None, total: int) -> None: ...

    def requests_served(self, requests: int, roots: int, elapsed: float) -> None: ...


def chunked(keys: np.ndarray, rows: int) -> list[np.ndarray]:
    """Root keys cut into chunks of ``rows`` (the last one may be shorter), in key order: the
    one definition of a chunk, for predict passes, training epochs and DDP ranks."""
    return [keys[i : i + rows] for i in range(0, len(keys), rows)]


class Workload:
    def __init__(self, chain: Chain) -> None:
        self.chain, self.spec = chain, chain.spec
        self.chunks: list[np.ndarray] = []
        self._kept: dict[int, Chunk] = {}  # training tensors of a single-chunk workload
        self._counted: set[int] = set()  # chunks whose data figures are counted
        # What it read and laid out; what the encode step turned into vectors, in the unit it
        # counts (text cells; a library's strings): every encode call (its rate), once per chunk
        self.data = DataTally()
        self.pricing: Listener | None = None  # inside the timed region: counts and the projection
        # the application's text encoder (chain.has_text): an extra timed step, before tensorize
        self.stages = StageTable(encode=chain.has_text)

    def sink(self, phase: str) -> StageSink:
        """Stage seconds and rows into the workload's stage table, under ``phase``."""
        stages = self.stages[phase]

        def add(stage: str, seconds: float, rows: int) -> None:
            stages[stage].add(seconds, rows)

        return add

    def list_keys(self) -> None:
        chain = self.chain
        with chain.clock.measure() as span:
            keys, nbytes = list_root_keys(self.spec, chain.sources)
        self.stages["predict"]["retrieve"].add(span.seconds, 0)
        self.stages["predict"]["retrieve"].bytes += nbytes
        self.data.bytes_read += nbytes
        self.use_keys(keys)

    def use_keys(self, keys: np.ndarray) -> None:
        """Work on ``keys`` (all the root keys, or a DDP rank's shard), in ``run.chunk_rows`` chunks."""
        self.data.root_rows = len(keys)
        self.chunks = chunked(keys, self.spec.run.chunk_rows)
        self.data.chunks = len(self.chunks)

    def account(self, p: Prepared, chunk: int | None, phase: str = "predict") -> None:
        """What a prepared chunk or request read; data figures once per chunk (``chunk`` None:
        a request, counted every time, its root rows served)."""
        res = self.data
        res.bytes_read += p.bytes_read
        res.rows_read = (res.rows_read or 0) + p.rows_read
        if self.chain.has_text:
            if res.encode_unit is not None and p.encode_unit != res.encode_unit:
                raise RuntimeError(f"one run's encode step counted {res.encode_unit}, then {p.encode_unit}")
            res.encode_unit = p.encode_unit
        res.encoded += p.encoded
        if chunk is None:
            res.rows_served += p.tz.root_rows
        if chunk is not None and chunk in self._counted:
            return
        if chunk is not None and phase == "train" and not self.chain.side.reuses_chunks:
            return  # a library's training encode holds the training rows only: count the predict one
        if chunk is not None:
            self._counted.add(chunk)
        res.encoded_per_pass += p.encoded
        res.coords_present += p.tz.coords_present
        if p.tz.coords_reserved is None or res.coords_reserved is None:
            res.coords_reserved = None  # no reserved layout (relational-transformers): no such figure
        else:
            res.coords_reserved += p.tz.coords_reserved
        for name, n in p.overflow_dropped.items():
            res.overflow_dropped[name] = res.overflow_dropped.get(name, 0) + n

    def data_report(self) -> DataReport:
        """What it read and laid out, with the encode step's figures (``data.text_cells`` and
        ``encode.cells_per_s``, or a library's strings under its own keys) over every encode
        call's seconds (none without an encode step)."""
        has_encode = self.chain.has_text
        seconds = sum(st["encode"].seconds for st in self.stages.phases.values()) if has_encode else None
        return self.data.report(seconds)

    def prepare(self, i: int, phase: str) -> Chunk:
        """Chunk ``i`` through the chain's timed steps, charged to ``phase``."""
        if phase == "train" and i in self._kept:
            return self._kept[i]
        p = self.chain.prepare(self.chunks[i], self.sink(phase), {"chunk": i, "phase": phase})
        self.account(p, i, phase)
        self.add_bytes(p, phase)
        if phase == "train" and self.keeps_training_tensors:
            self._kept[i] = p.tz
        if self.pricing is not None:
            self.pricing.chunk_ready(i, phase, p.tz)
        return p.tz

    @property
    def keeps_training_tensors(self) -> bool:
        """Whether training keeps its tensors between epochs: one chunk, a side that reuses
        chunks (``ModelSide.reuses_chunks``). A library may learn while it encodes training rows,
        or draw masks per epoch (tasks/libraries): its training chunks are encoded again every epoch."""
        return len(self.chunks) == 1 and self.chain.side.reuses_chunks

    def root_rows_to_prepare(self, phase: str) -> int:
        """Root rows ``phase``'s stages take over the whole run: every row per epoch (once when
        training keeps its tensors) or per predict pass."""
        rows = sum(len(c) for c in self.chunks)
        if phase == "train":
            return rows if self.keeps_training_tensors else rows * self.spec.run.epochs
        return rows * self.spec.run.repeats

    def add_bytes(self, p: Prepared, phase: str) -> None:
        """A prepared chunk's or request's stage bytes into ``phase``'s stage table."""
        stages = self.stages[phase]
        for stage, n in p.stage_bytes().items():
            stages[stage].bytes += n

    def prepare_untimed(self, i: int) -> Chunk:
        """Chunk ``i`` outside every timing (kept training tensors are reused)."""
        # A library's training encode holds the training rows only (tasks/libraries): re-prepare.
        reusable = i in self._kept and self.chain.side.reuses_chunks
        return self._kept[i] if reusable else self.chain.prepare_untimed(self.chunks[i])

    def train(self) -> TrainingReport:
        """``run.epochs`` epochs over every chunk (a one-chunk workload keeps its tensors), each
        chunk's compute through the chain; returns the epochs run and the updates of the first.
        The one epoch loop: a DDP rank (tasks/run/distributed/rank.py) runs it over its shard."""
        sink = self.sink("train")
        if self.pricing is not None:
            self.pricing.begin("train")
        epochs = updates_per_epoch = 0
        for epoch in range(self.spec.run.epochs):
            engine = self.chain.engine
            before = engine.train_timings.updates if engine else 0
            for i in range(len(self.chunks)):
                tz = self.prepare(i, "train")
                self.chain.train(tz, sink, {"chunk": i, "phase": "train", "epoch": epoch})
            if self.chain.engine is not None:
                self.chain.engine.end_epoch()
            if epoch == 0 and self.chain.engine is not None:
                updates_per_epoch = self.chain.engine.train_timings.updates - before
            epochs += 1
        return TrainingReport(epochs, updates_per_epoch)

    def fit_calibration(self) -> CalibrationFit:
        """Temperature scaling on the fit half of the validation rows of every chunk (the other
        half reports calibration quality: tasks/stages/split.py), after training (not a
        stage: chunks are re-read outside the timings, through the same chain).

        The fit's forward passes run with compiled regions forced eager: compiling here would
        warm the eval-mode graphs the predict path runs, so predict's first call (and
        ``latency.first_request_ms``) would leave out their compilation (issue 19)."""
        chain, kind = self.chain, self.spec.task.kind
        engine = chain.engine
        with chain.clock.measure() as span, torch.compiler.set_stance("force_eager"):
            temperature, rows, errors = 1.0, 0, None
            if kind in CALIBRATED_KINDS and engine is not None:
                xs, ys = [], []
                for i in range(len(self.chunks)):
                    x, y = validation_logits(engine, self.prepare_untimed(i))
                    xs.append(x)
                    ys.append(y)
                x_N, y_N = torch.cat(xs), torch.cat(ys)
                temperature, rows = fit_temperature(x_N, y_N, kind), int(x_N.shape[0])
                errors = fit_errors(x_N, y_N, kind) if rows else None
        chain.set_temperature(temperature)
        return CalibrationFit(span.seconds, rows, errors)
