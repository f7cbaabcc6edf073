"""The compute engine of a library under test: the harness's loop around a library's steps.

A library (relflow, relational-transformers) supplies a ``Driver``: how to cut a chunk's
encoded inputs into device batches, one train step, one predict step, and what a batch held.
This engine runs them inside the same clocked loop as the reference model's
(``EngineBase.timed_batches``: first call, warm-up and steady batches, the wait for input,
Dynamo frames per phase, the product's throughput estimate next to the exact rows), so every
library's figures mean the same thing.

Predictions follow the harness's convention, whatever the library returns: category logits
``[B, C]`` over the chunk's label indices, a binary logit ``[B]``, a regression value ``[B]``
in the target's own units. Temperature scaling (tasks/stages/calibrate.py) and quality
(tasks/measure/quality.py) then work unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import torch

from tasks.measure.clock import Clock
from tasks.spec import Spec
from tasks.stages.engine import EngineBase, ModelFacts, PredictOutputs


def binary_probability(logits: torch.Tensor) -> pa.Array:
    """The prediction file's column for a binary target: P(true) per row, float64.

    The sigmoid runs in float64: a large fitted temperature leaves calibrated logits near 0,
    where float32 sigmoids tie (0.5 +- 6e-8 per step) and the written probabilities would lose
    the ranking the logits hold (the file's AUC, relbench.roc_auc, below quality.auc)."""
    return pa.array(torch.sigmoid(logits.detach().double()).cpu().numpy())


@dataclass
class LibraryChunk:
    """A chunk tensorized by a library: the harness's ``Chunk`` plus the library's inputs."""

    keys: pa.Array  # root keys, aligned with the rows
    is_train: torch.Tensor  # bool [B]
    is_fit: torch.Tensor  # bool [B]: held out, fits the output calibration
    is_scored: torch.Tensor  # bool [B]: held out, scored (quality.*)
    labels: torch.Tensor  # [B]: class index (category), 0/1 (binary), value (regression)
    label_present: torch.Tensor  # bool [B]: the target is known for the row
    coords_present: int  # cells (coordinates) the library's inputs hold for these rows
    coords_reserved: int | None  # cells its reserved layout has room for; None: it has none
    root_rows: int
    inputs: Any  # the library's encoded chunk (a TensorDict, contexts + cell vectors, ...)
    input_tensors: list[torch.Tensor] = field(default_factory=list)  # what tensorize produced
    encoded_rows: int | None = None  # rows the library encoded, where not every row (None: all)

    @property
    def tensorized_rows(self) -> int:
        return self.root_rows if self.encoded_rows is None else self.encoded_rows

    @property
    def produced_bytes(self) -> int:
        return sum(t.nbytes for t in self.input_tensors)

    def tensors(self) -> list[torch.Tensor]:
        return self.input_tensors


class Driver(Protocol):
    """One library's steps, called by ``LibraryEngine`` per batch (never timed by the driver)."""

    name: str  # model.library

    def batches(self, chunk: LibraryChunk, rows: torch.Tensor) -> Iterator[tuple[Any, int]]:
        """Device batches over ``rows`` in the order given (``run.batch_size`` rows each; by
        length where the library buckets), with their root-row counts."""
        ...

    def rows_of(self, part: Any) -> torch.Tensor:
        """The chunk rows a batch from ``batches`` holds, in the batch's order."""
        ...

    def train_step(self, part: Any) -> None: ...

    def end_epoch(self) -> None: ...

    def predict_step(self, part: Any) -> torch.Tensor:
        """The prediction of a batch in the harness's convention (see the module note)."""
        ...

    def layout_refs(self, part: Any) -> Any:
        """What ``layout`` counts of this batch, by reference (its masks): no reduction, no
        host copy, nothing of the batch's inputs. Taken inside the timed step; the engine
        keeps it until it settles, after the compute stage."""
        ...

    def layout(self, refs: Any) -> tuple[int, int, tuple[int, ...]]:
        """(present, padded) cells the model received in the batch ``refs`` came from, and
        its padded shape (distinct shapes are ``data.batch_shapes``); counted after the
        compute stage (``EngineBase.settle``)."""
        ...

    def cells(self, part: Any) -> torch.Tensor | None:
        """The batch's ``[contexts, cells]`` padding mask where the library's FLOPs follow
        tasks/measure/cell_flops.py's form (``ModelFacts.flop_model``); None otherwise."""
        ...

    def predictions_table(self, keys: pa.Array, prediction: torch.Tensor) -> pa.Table: ...

    def facts(self) -> ModelFacts: ...

    def save(self, path: Path) -> None: ...

    def paths(self) -> set[str]:
        """How the library ran its regions (e.g. ``packed``, ``compiled``), for the tag."""
        ...

    def session_threads(self) -> int | None:
        """The intra-op threads of the session that served the predict steps, when it fixed
        its own (``EngineBase.session_threads``); None: they ran on torch's. Asked after
        ``close``, so the driver keeps the count."""
        ...

    def close(self) -> None: ...


class LibraryEngine(EngineBase):
    """``EngineBase`` over a library ``Driver``."""

    def __init__(self, spec: Spec, device: torch.device, clock: Clock | None, driver: Driver) -> None:
        super().__init__(spec, device, clock)
        self.driver = driver
        self._generator = torch.Generator().manual_seed(spec.run.seed)

    def _chunk(self, tz: object) -> LibraryChunk:
        assert isinstance(tz, LibraryChunk), f"model.library {self.driver.name} tensorizes its own chunks"
        return tz

    def train(self, tz: object) -> None:
        """One pass over the chunk's training rows, shuffled with the run's seed."""
        chunk = self._chunk(tz)
        rows = torch.nonzero(chunk.is_train).flatten()
        if rows.numel() == 0:
            return
        order = rows[torch.randperm(rows.numel(), generator=self._generator)]
        t = self.train_timings
        window = self.clock.window()
        with self.clock.measure() as wall:
            for part, n in self.timed_batches("train", t, self.driver.batches(chunk, order), window):
                steady = t.in_steady_state
                recorded = functools.partial(self.record, "train", t, rows=n, part=part)
                with self.profiler.batch("train", steady), window.span(recorded):
                    self.driver.train_step(part)
                window.batch_done(steady)
                t.updates += 1
            window.flush()
        self.wall_seconds += wall.seconds
        self.paths_seen |= self.driver.paths()

    @torch.no_grad()
    def predict(self, tz: object, outputs: tuple[str, ...]) -> PredictOutputs:
        """The prediction for every root row, in key order; quality over held-out rows."""
        chunk = self._chunk(tz)
        t = self.predict_timings
        window = self.clock.window()
        preds: list[torch.Tensor] = []
        ran: list[torch.Tensor] = []
        with self.clock.measure() as wall:
            for part, n in self.timed_batches(
                "predict", t, self.driver.batches(chunk, torch.arange(chunk.root_rows)), window
            ):
                steady = t.in_steady_state
                recorded = functools.partial(self.record, "predict", t, rows=n, part=part)
                with self.profiler.batch("predict", steady), window.span(recorded):
                    pred = self.driver.predict_step(part).float().to("cpu")
                window.batch_done(steady)
                # references only: the layout is counted after the compute stage (``settle``)
                self.keep_layout(functools.partial(self.driver.layout, self.driver.layout_refs(part)))
                mask = self.driver.cells(part) if steady else None
                if mask is not None:
                    self.steady_cell_masks.append(mask)
                preds.append(pred)
                ran.append(self.driver.rows_of(part))
            window.flush()
        self.wall_seconds += wall.seconds
        self.paths_seen |= self.driver.paths()
        prediction = _in_key_order(torch.cat(preds), torch.cat(ran), chunk.root_rows)
        mask = chunk.label_present & chunk.is_scored
        # every held-out row with a label counts: a class not learned (none at all, untrained) as wrong
        self.quality.keep(prediction, chunk.labels, mask, chunk.keys, chunk.is_scored)  # scored by ``settle``
        return PredictOutputs({"prediction": prediction}, labels=chunk.labels, label_mask=mask)

    @torch.no_grad()
    def validation_logits(self, tz: object, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self._chunk(tz)
        xs, ran = [], []
        for part, _ in self.driver.batches(chunk, rows):
            xs.append(self.driver.predict_step(part).float().cpu())
            ran.append(self.driver.rows_of(part))
        x, order = torch.cat(xs), torch.cat(ran)
        keep = chunk.label_present[order]
        return x[keep], chunk.labels[order][keep]

    def end_epoch(self) -> None:
        self.driver.end_epoch()

    def predictions_table(self, keys: pa.Array, outs: PredictOutputs) -> pa.Table:
        return self.driver.predictions_table(keys, outs.tensors["prediction"])

    def facts(self) -> ModelFacts:
        return self.driver.facts()

    def session_threads(self) -> int | None:
        return self.driver.session_threads()

    def save_checkpoint(self, path: Path, spec: Spec) -> None:
        self.driver.save(path)

    def close(self) -> None:
        self.driver.close()


def _in_key_order(values: torch.Tensor, rows: torch.Tensor, n: int) -> torch.Tensor:
    """Batch outputs (in the order the rows ran: shuffled by length buckets) back in the
    chunk's row order; every row must have run exactly once."""
    if rows.numel() != n or not torch.equal(torch.sort(rows).values, torch.arange(n)):
        raise RuntimeError(f"the library's batches covered {rows.numel()} rows of {n}, not each row once")
    out = torch.empty_like(values)
    out[rows] = values
    return out
