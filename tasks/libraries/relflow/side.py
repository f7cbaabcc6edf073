"""relflow inside the harness's chain: its tensorize step (``Model.encode``) and its engine.

The harness reads and preprocesses (the nested table, columnar); then, per chunk:

- **tensorize** = ``mapping.input_table`` (the casts relflow needs) + relflow's
  ``Model.encode`` of the chunk, its own stage row. A training chunk encodes only its
  training rows, with ``strata=train`` (relflow learns vocabularies and numeric statistics
  while it encodes, so held-out rows never shape them); a predict chunk encodes every row
  with ``strata=predict`` (no learning, no masks). The first chunk also builds the relflow
  model (``mapping.build``), inside that step's time as the reference model's first fit is.
- **compute** = relflow's ``training_step`` + the run's ``rf.adamw`` step per batch, and its
  predict-mode forward, in the harness's clocked loop (``LibraryEngine``). Batches are root
  rows sliced from the chunk's TensorDict.
- **write** = the harness's atomic Parquet writer, over the calibrated prediction with
  relflow's class vocabulary (the same columns as the reference model's file).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import torch
from tensordict import TensorDict

from tasks.libraries.base import OwnInputs
from tasks.libraries.engine import LibraryChunk, LibraryEngine, binary_probability
from tasks.libraries.relflow.driver import CompiledCalls, OccupancyMasks, RelflowDriver
from tasks.libraries.relflow.mapping import LIBRARY
from tasks.measure import keys as K
from tasks.measure.clock import Clock
from tasks.measure.records import PhaseTimings
from tasks.spec import Spec
from tasks.stages.encode import Encoded
from tasks.stages.engine import EngineBase, ModelFacts
from tasks.stages.preprocess import Preprocessed
from tasks.stages.split import role_masks


@dataclass
class _Part:
    """One device batch: its TensorDict and the chunk rows it holds."""

    td: TensorDict
    rows: torch.Tensor  # chunk rows, in the batch's order
    input_rows: int  # rows of the encoded TensorDict it was sliced from (allocated extent)
    logged: float | None = None  # relflow's ThroughputLogger figure for this batch, after its step
    loss: float | None = None  # the training loss relflow returned for this batch


class RelflowSide(OwnInputs):
    """The ``ModelSide`` (tasks/libraries/base.py) of one run over relflow."""

    def __init__(self, spec: Spec, device: torch.device, checkpoint: Path | None) -> None:
        self.spec, self.device = spec, device
        self.driver: RelflowDriver | None = RelflowDriver.load(spec, checkpoint, device) if checkpoint else None
        self.calls: CompiledCalls | None = None
        if self.driver is not None:
            self._compile()

    def _compile(self) -> None:
        c = self.spec.run.compile
        if self.driver is not None and (c.encoders or c.pools):
            self.calls = self.driver.compile()

    encodes = False  # relflow encodes in its own Model.encode (the tensorize step)

    def encode(self, pre: Preprocessed, train: bool) -> Encoded:
        raise AssertionError("relflow has no encode step of the application's")

    def tensorize(self, pre: Preprocessed, train: bool, encoded: Encoded | None) -> LibraryChunk:
        spec = self.spec
        if self.driver is None:  # the first chunk: build the model (relflow sizes it from data)
            # Initial weights from run.seed, as the reference model's engine draws them: else
            # they follow whatever drew from torch's global generator before this chunk.
            torch.manual_seed(spec.run.seed)
            self.driver = RelflowDriver.build(spec, pre.table, self.device)
            self._compile()
        driver = self.driver
        table = driver.input_table(pre.table)
        train_rows, fit, scored = role_masks(pre.table)
        is_train = torch.from_numpy(train_rows)
        keys = pre.table[spec.schema_.root.key].combine_chunks()
        rows = torch.nonzero(is_train).flatten() if train else torch.arange(pre.root_rows)
        encoded = driver.encode(table.take(pa.array(rows.numpy())) if train else table, train=train, epoch=driver.epoch)
        # After encoding: a training encode grows the target's vocabulary, whose order is the
        # class axis of the logits the labels index into.
        labels, present = driver.labels(table)
        occupancy = driver.occupancy(encoded)
        return LibraryChunk(
            keys=keys,
            is_train=is_train,
            is_fit=torch.from_numpy(fit),
            is_scored=torch.from_numpy(scored),
            labels=labels,
            label_present=present,
            coords_present=occupancy.present,
            coords_reserved=occupancy.reserved,
            root_rows=pre.root_rows,
            inputs=_Encoded(encoded, rows),
            input_tensors=[t for t in encoded.flatten_keys().values() if isinstance(t, torch.Tensor)],
            encoded_rows=int(rows.numel()),  # a training chunk encodes its training rows only
        )

    def engine(self, clock: Clock) -> EngineBase | None:
        if self.driver is None:
            return None
        return _RelflowEngine(self.spec, self.device, clock, _Steps(self.spec, self.driver, self))


class _RelflowEngine(LibraryEngine):
    """``LibraryEngine`` that hands each timed batch's place (steady or not) to relflow's
    logged figures, so they are summarised over the same batches as the harness's own."""

    def __init__(self, spec: Spec, device: torch.device, clock: Clock, steps: _Steps) -> None:
        super().__init__(spec, device, clock, steps)
        self.steps = steps
        self._tracked = True

    def record(self, phase: str, t: PhaseTimings, seconds: float, rows: int, part: object) -> None:
        if self._tracked:
            self.steps.logged.add(phase, cast(_Part, part), steady=t.in_steady_state)
        super().record(phase, t, seconds, rows, part)

    @contextmanager
    def untracked(self) -> Iterator[None]:
        self._tracked = False  # the output check's pass: no figure of the run, relflow's neither
        try:
            with super().untracked():
                yield
        finally:
            self._tracked = True


@dataclass
class LoggedFigures:
    """relflow's own per-batch figures of the timed batches, by phase, and their summaries
    (the keys' catalogue rows in tasks/measure/keys.py say what each one is)."""

    steady: dict[str, list[float]] = field(default_factory=lambda: {"train": [], "predict": []})
    last: dict[str, float] = field(default_factory=dict)
    last_loss: float | None = None

    def add(self, phase: str, part: _Part, *, steady: bool) -> None:
        if part.logged is None:
            return
        if steady:
            self.steady[phase].append(part.logged)
        self.last[phase] = part.logged
        if phase == "train" and part.loss is not None:
            self.last_loss = part.loss

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for phase, rates in self.steady.items():
            if rates:
                out[K.compute(phase, K.LIBRARY_LOGGER_STEADY_MEAN_ROWS_PER_S)] = float(np.mean(rates))
        for phase, rate in self.last.items():
            out[K.compute(phase, K.LIBRARY_LOGGER_LAST_ROWS_PER_S)] = rate
        if self.last_loss is not None and math.isfinite(self.last_loss):
            out[K.LIBRARY_LOGGER_TRAIN_LAST_LOSS] = self.last_loss
        return out


@dataclass
class _Encoded:
    td: TensorDict
    rows: torch.Tensor  # chunk rows the TensorDict holds, in its order

    def positions(self, rows: torch.Tensor, n: int) -> torch.Tensor:
        """Where chunk ``rows`` sit in the TensorDict (every one must be there)."""
        where = torch.full((n,), -1, dtype=torch.long)
        where[self.rows] = torch.arange(self.rows.numel())
        pos = where[rows]
        if bool((pos < 0).any()):
            raise RuntimeError("a batch asked for chunk rows the relflow encoding does not hold")
        return pos


class _Steps:
    """The ``Driver`` (tasks/libraries/engine.py) over a ``RelflowDriver``."""

    name = LIBRARY

    def __init__(self, spec: Spec, driver: RelflowDriver, side: RelflowSide) -> None:
        self.spec, self.driver, self.side = spec, driver, side
        self.logged = LoggedFigures()

    def batches(self, chunk: LibraryChunk, rows: torch.Tensor) -> Iterator[tuple[Any, int]]:
        encoded = cast(_Encoded, chunk.inputs)
        positions = encoded.positions(rows, chunk.root_rows)
        n_input = int(encoded.rows.numel())
        for idx, pos in zip(
            rows.split(self.spec.run.batch_size), positions.split(self.spec.run.batch_size), strict=True
        ):
            yield _Part(RelflowDriver.take(encoded.td, pos), idx, n_input), int(idx.numel())

    def rows_of(self, part: Any) -> torch.Tensor:
        return cast(_Part, part).rows

    def train_step(self, part: Any) -> None:
        p = cast(_Part, part)
        p.loss = self.driver.train_step(p.td)
        p.logged = self.driver.logged(training=True)

    def end_epoch(self) -> None:
        self.driver.end_epoch()

    def predict_step(self, part: Any) -> torch.Tensor:
        p = cast(_Part, part)
        out = self.driver.predict(p.td)
        p.logged = self.driver.logged(training=False)
        # The harness's convention: logits for category and binary (temperature scaling and
        # quality read logits), the value in the target's units for regression.
        return out["logits"] if self.spec.task.kind in ("category", "binary") else out["prediction"]

    def layout_refs(self, part: Any) -> Any:
        return self.driver.occupancy_masks(cast(_Part, part).td)  # the fields' masks, uncounted

    def layout(self, refs: Any) -> tuple[int, int, tuple[int, ...]]:
        occ = cast(OccupancyMasks, refs).count()  # it walks every field: after the compute stage
        shape = tuple(f.allocated // max(occ.rows, 1) for f in occ.sequences.values())
        return occ.present, occ.allocated, shape

    def cells(self, part: Any) -> torch.Tensor | None:
        return None  # no FLOPs count: relflow packs each batch's live slots (facts' flops_note)

    def predictions_table(self, keys: pa.Array, prediction: torch.Tensor) -> pa.Table:
        cols: dict[str, pa.Array] = {self.spec.schema_.root.key: keys}
        kind = self.spec.task.kind
        for name in self.spec.task.outputs:
            head, _, arg = name.partition(":")
            if head == "prediction" and kind == "category" and prediction.shape[-1] == 0:
                # untrained weights (predict without run.checkpoint): relflow learns its classes
                # while encoding training rows, so there is no class to name
                cols["prediction"] = pa.nulls(len(keys), pa.string())
            elif head == "prediction" and kind == "category":
                classes = pa.array(self.driver.classes(), pa.string())
                cols["prediction"] = classes.take(pa.array(prediction.argmax(-1).numpy()))
            elif head == "prediction" and kind == "binary":
                cols["prediction"] = binary_probability(prediction)
            elif head == "prediction":
                cols["prediction"] = pa.array(prediction.numpy().astype(np.float64))
            elif head == "topk" and prediction.shape[-1] > 0:
                k = min(int(arg), prediction.shape[-1])
                scores, idx = torch.softmax(prediction, -1).topk(k, dim=-1)
                classes = pa.array(self.driver.classes(), pa.string())
                labels = classes.take(pa.array(idx.reshape(-1).numpy()))
                cols[f"top{k}_labels"] = pa.FixedSizeListArray.from_arrays(labels, k)
                cols[f"top{k}_scores"] = pa.FixedSizeListArray.from_arrays(pa.array(scores.reshape(-1).numpy()), k)
        return pa.table(cols)

    def facts(self) -> ModelFacts:
        metrics: dict[str, float] = self.logged.metrics()  # relflow's own figures, copied after the run
        calls = self.side.calls
        # relflow serves with PyTorch only (checks refuse other run.backend values); the key is
        # the reference's, so one filter on the serving backend finds every library's runs
        tags = {"relflow.backend": self.spec.run.backend, "relflow.library_packing": _packing_tag(self.driver)}
        if calls is not None:
            metrics[K.COMPILED_REGION_CALLS] = float(calls.compiled)
            metrics[K.EAGER_REGION_CALLS] = float(calls.eager_total)
            tags["relflow.library_eager_reasons"] = ",".join(f"{k}={v}" for k, v in sorted(calls.eager.items()))
        return ModelFacts(
            LIBRARY,
            self.driver.parameter_count(),
            None,
            "relflow packs present coordinates per batch: FLOPs per root row vary with each batch's live slots",
            tags,
            metrics,
        )

    def save(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        self.driver.save(tmp)
        tmp.replace(path)

    def paths(self) -> set[str]:
        return {"relflow-compiled" if self.side.calls is not None else "relflow-eager"}

    def session_threads(self) -> int | None:
        return None  # PyTorch only (no ONNX export): torch's threads

    def close(self) -> None:
        return None


def _packing_tag(driver: RelflowDriver) -> str:
    """Which encoder regions pack present coordinates in predict mode, and why others do not."""
    facts = driver.packing(training=False)
    return "; ".join(f"{f.region}: {'packed' if f.eligible else f.why_not}" for f in facts)
