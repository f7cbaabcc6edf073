"""LightGBM inside the harness's chain: its tensorize step and its engine.

The harness reads and preprocesses (the nested table, as of the seed time); then, per chunk:

- **tensorize** = the flattening (``features.flatten``: per-branch aggregates, columnar) into a
  ``[rows, features]`` float64 matrix, and the labels. The first chunk also fits what the
  features are (category vocabularies) and the classes, from its training rows, inside that
  step's time as the reference model's first fit is.
- **compute**, training phase = the boosting rounds of one ``Stage`` over the chunk's labelled
  training rows (booster.py): a training batch is one round over all of them (``update()``),
  the first one builds LightGBM's Dataset (its binning: the phase's first call).
- **compute**, predict phase = the ensemble's raw scores, ``run.batch_size`` rows per batch.
- **write** = the harness's atomic Parquet writer, calibrated as every library's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import lightgbm as lgb
import numpy as np
import pyarrow as pa
import torch

from tasks.libraries.base import OwnInputs
from tasks.libraries.engine import LibraryChunk, LibraryEngine, binary_probability
from tasks.libraries.lightgbm.booster import ROUNDS, Ensemble, Stage
from tasks.libraries.lightgbm.checks import LIBRARY
from tasks.libraries.lightgbm.features import MAX_VALUES, fit, flatten
from tasks.measure.clock import Clock
from tasks.spec import Spec
from tasks.stages.encode import Encoded
from tasks.stages.engine import EngineBase, ModelFacts
from tasks.stages.preprocess import Preprocessed
from tasks.stages.split import role_masks

__all__ = ["LightGBMSide"]


@dataclass
class _Round:
    """One training batch: a boosting round of ``stage`` over its rows."""

    stage: Stage
    rows: torch.Tensor  # the chunk rows it trains on


@dataclass
class _Rows:
    """One predict batch: feature rows and the chunk rows they are."""

    features: np.ndarray
    rows: torch.Tensor


class LightGBMSide(OwnInputs):
    """The ``ModelSide`` (tasks/libraries/base.py) of one run over LightGBM."""

    encodes = False  # the flattening is its tensorize step

    def __init__(self, spec: Spec, device: torch.device) -> None:
        self.spec, self.device = spec, device
        self.model: Ensemble | None = Ensemble.load(Path(spec.run.checkpoint), spec) if spec.run.checkpoint else None

    def encode(self, pre: Preprocessed, train: bool) -> Encoded:
        raise AssertionError("LightGBM has no encode step of the application's")

    def tensorize(self, pre: Preprocessed, train: bool, encoded: Encoded | None) -> LibraryChunk:
        spec = self.spec
        if self.model is None:  # the first chunk: what the features and classes are
            self.model = Ensemble.fit(spec, pre.table, fit(spec, pre.table))
        x = flatten(spec, pre.table, self.model.flattening)
        labels, present = self.model.labels(pre.table, spec.task.target)
        train_rows, fit_rows, scored = role_masks(pre.table)
        xt = torch.from_numpy(x)
        return LibraryChunk(
            keys=pre.table[spec.schema_.root.key].combine_chunks(),
            is_train=torch.from_numpy(train_rows),
            is_fit=torch.from_numpy(fit_rows),
            is_scored=torch.from_numpy(scored),
            labels=labels,
            label_present=present,
            # (row, feature) cells the input holds (not missing); no reserved layout: the
            # features are a flat matrix, not coordinates of the nested row
            coords_present=int(torch.isfinite(xt).sum()),
            coords_reserved=None,
            root_rows=pre.root_rows,
            inputs=x,
            input_tensors=[xt],
        )

    def engine(self, clock: Clock) -> EngineBase | None:
        if self.model is None:
            return None
        return _LightGBMEngine(self.spec, self.device, clock, _Steps(self.spec, self.model))


class _LightGBMEngine(LibraryEngine):
    """``LibraryEngine`` whose training batches are boosting rounds (``_Steps.rounds``)."""

    def __init__(self, spec: Spec, device: torch.device, clock: Clock, steps: _Steps) -> None:
        super().__init__(spec, device, clock, steps)
        self.steps = steps

    def train(self, tz: object) -> None:
        self.steps.boosting = True  # the engine's loop asks for batches: rounds, not row slices
        try:
            super().train(tz)
        finally:
            self.steps.boosting = False


class _Steps:
    """The ``Driver`` (tasks/libraries/engine.py) over an ``Ensemble``."""

    name = LIBRARY

    def __init__(self, spec: Spec, model: Ensemble) -> None:
        self.spec, self.model = spec, model
        self.boosting = False
        self.rounds_run = 0

    def batches(self, chunk: LibraryChunk, rows: torch.Tensor) -> Iterator[tuple[Any, int]]:
        x = cast(np.ndarray, chunk.inputs)
        if self.boosting:  # a training pass: ROUNDS rounds over every labelled training row
            rows = torch.sort(rows).values  # the engine shuffled them; a Dataset needs no order
            rows = rows[chunk.label_present[rows]]
            if rows.numel() == 0:
                return
            idx = rows.numpy()
            labels = chunk.labels[rows].numpy().astype(np.float64)
            stage = self.model.stage(x[idx], labels)
            for _ in range(ROUNDS):
                if stage.finished:  # LightGBM has no split left to make (booster.py)
                    return
                yield _Round(stage, rows), int(rows.numel())
            return
        for part in rows.split(self.spec.run.batch_size):
            yield _Rows(x[part.numpy()], part), int(part.numel())

    def rows_of(self, part: Any) -> torch.Tensor:
        return cast(_Rows, part).rows

    def train_step(self, part: Any) -> None:
        self.model.update(cast(_Round, part).stage)
        self.rounds_run += 1

    def end_epoch(self) -> None:
        return None

    def predict_step(self, part: Any) -> torch.Tensor:
        return torch.from_numpy(self.model.raw(cast(_Rows, part).features))

    def layout_refs(self, part: Any) -> Any:
        return cast(_Rows, part).features  # the batch's matrix, by reference

    def layout(self, refs: Any) -> tuple[int, int, tuple[int, ...]]:
        x = cast(np.ndarray, refs)  # (row, feature) cells present (not missing) / in the matrix
        return int(np.isfinite(x).sum()), int(x.size), tuple(x.shape)

    def cells(self, part: Any) -> torch.Tensor | None:
        return None  # no FLOPs: comparisons down trees (facts' flops_note)

    def predictions_table(self, keys: pa.Array, prediction: torch.Tensor) -> pa.Table:
        cols: dict[str, pa.Array] = {self.spec.schema_.root.key: keys}
        kind = self.spec.task.kind
        classes = pa.array(list(self.model.classes), pa.string())
        for name in self.spec.task.outputs:
            head, _, arg = name.partition(":")
            if head == "prediction" and kind == "category":
                cols["prediction"] = classes.take(pa.array(prediction.argmax(-1).numpy()))
            elif head == "prediction" and kind == "binary":
                cols["prediction"] = binary_probability(prediction)
            elif head == "prediction":
                cols["prediction"] = pa.array(prediction.numpy().astype(np.float64))
            elif head == "topk" and kind == "category":
                k = min(int(arg), prediction.shape[-1])
                scores, idx = torch.softmax(prediction, -1).topk(k, dim=-1)
                labels = classes.take(pa.array(idx.reshape(-1).numpy()))
                cols[f"top{k}_labels"] = pa.FixedSizeListArray.from_arrays(labels, k)
                cols[f"top{k}_scores"] = pa.FixedSizeListArray.from_arrays(pa.array(scores.reshape(-1).numpy()), k)
        return pa.table(cols)

    def facts(self) -> ModelFacts:
        m = self.model
        tags = {
            "relflow.backend": LIBRARY,  # its own C++ predictor served the predict passes
            "relflow.library_model": (
                f"{m.params['objective']} gbdt, {m.trees()} trees in {len(m.boosters)} stage(s) of {ROUNDS} rounds, "
                "31 leaves, learning rate 0.1 (LightGBM's defaults)"
            ),
            "relflow.library_features": (
                f"{len(m.flattening.names)} flattened aggregates (count; mean/min/max/last; top {MAX_VALUES} "
                "category counts)"
            ),
            "relflow.library_num_threads": str(m.params["num_threads"]),
        }
        return ModelFacts(
            LIBRARY,
            m.nodes(),
            None,
            "a tree ensemble: its work is comparisons down trees, not FLOPs (no MFU); model.parameters counts "
            "its split thresholds and leaf values",
            tags,
        )

    def save(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        self.model.save(tmp)
        tmp.replace(path)

    def paths(self) -> set[str]:
        return {f"lightgbm-{lgb.__version__}"}

    def session_threads(self) -> int | None:
        return None  # LightGBM's OpenMP threads are torch's count (params num_threads)

    def close(self) -> None:
        return None
