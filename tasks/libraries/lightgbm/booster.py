"""The boosted ensemble: stages of LightGBM boosters over the flattened features.

A training pass over one chunk (``Stage``) is a LightGBM ``Booster`` on that chunk's training
rows, started from the scores of every stage before it (LightGBM's ``init_score``: what
``lgb.train(init_model=...)`` does underneath) and boosted ``ROUNDS`` rounds, one round per
``update()``; the model's raw score is the sum of its stages'. One chunk and ``run.epochs``
epochs is ``run.epochs`` stages of ``ROUNDS`` rounds each, which equals one booster of
``epochs x ROUNDS`` rounds: each stage starts exactly where the last one stopped. A stage
ends early when LightGBM finds no split that gains (its ``update()`` says it is finished, as
its own training loop stops): a later round would only repeat nothing.

Raw scores follow the harness's convention (tasks/libraries/engine.py): a binary logit, a
category's per-class scores (logits: LightGBM's multiclass probability is their softmax), a
regression value in the target's units. LightGBM's own parameters are its defaults (gbdt,
31 leaves, learning rate 0.1, 20 rows per leaf), with the run's seed and torch's thread count.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from model.batch import UNSEEN_CLASS
from tasks.libraries.lightgbm.features import TRAIN_COLUMN, Flattening
from tasks.runtime.errors import UserError
from tasks.spec import Spec

__all__ = ["ROUNDS", "Ensemble", "Stage", "objective"]

ROUNDS = 100  # boosting rounds per training pass over a chunk: LightGBM's num_iterations default
FORMAT = "relflow-bench lightgbm ensemble v1"


def objective(kind: str, classes: int) -> dict[str, Any]:
    """LightGBM's objective for a task kind (its defaults otherwise)."""
    if kind == "category":
        return {"objective": "multiclass", "num_class": max(classes, 1)}
    if kind == "binary":
        return {"objective": "binary"}
    return {"objective": "regression"}  # L2, LightGBM's default


@dataclass
class Stage:
    """One training pass: its Dataset is built by the first round (inside that batch's time,
    as a first call), then each ``update`` is one boosting round."""

    features: np.ndarray  # [rows, features] of the chunk's labelled training rows
    labels: np.ndarray
    init: np.ndarray | None  # the earlier stages' raw scores on these rows
    booster: lgb.Booster | None = None
    rounds: int = 0
    finished: bool = False  # LightGBM found no split worth making: later rounds would add nothing


@dataclass
class Ensemble:
    """Everything a LightGBM run learns and saves: the features, the classes, the stages."""

    kind: str
    flattening: Flattening
    classes: tuple[str, ...]  # category targets: the training rows' labels, sorted (the class axis)
    params: dict[str, Any]
    boosters: list[lgb.Booster] = field(default_factory=list)

    @staticmethod
    def fit(spec: Spec, table: pa.Table, flattening: Flattening) -> Ensemble:
        """A fresh ensemble for ``spec``: classes from ``table``'s training rows."""
        kind, classes = spec.task.kind, tuple[str, ...]()
        if kind == "category" and spec.task.target in table.column_names:
            train = table[TRAIN_COLUMN].combine_chunks().fill_null(False)
            values = pc.filter(_strings(table[spec.task.target]), train).drop_null()
            classes = tuple(sorted(str(v) for v in pc.unique(values).to_pylist()))
        params = {
            **objective(kind, len(classes)),
            "verbose": -1,
            "seed": spec.run.seed,
            "deterministic": True,
            "num_threads": torch.get_num_threads(),  # run.threads.intra_op, as every library's
        }
        return Ensemble(kind, flattening, classes, params)

    # -- labels --------------------------------------------------------------------------

    def labels(self, table: pa.Table, target: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(labels, present) per row in the harness's convention: a class index (a known value
        outside ``classes``: ``UNSEEN_CLASS``, not present), 0/1, or the value."""
        n = table.num_rows
        if target not in table.column_names:  # a request's rows without labels
            return torch.zeros(n), torch.zeros(n, dtype=torch.bool)
        raw = table[target].combine_chunks()
        known = np.asarray(raw.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        if self.kind == "category":
            idx = pc.index_in(_strings(raw), value_set=pa.array(self.classes, pa.string()))
            found = np.asarray(idx.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            values = np.where(found, idx.fill_null(0).to_numpy(zero_copy_only=False), UNSEEN_CLASS)
            labels = torch.from_numpy(np.where(known, values, 0).astype(np.int64))
            return labels, torch.from_numpy(known & found)
        if self.kind == "binary":
            try:
                values = pc.cast(raw, pa.bool_()).fill_null(False).to_numpy(zero_copy_only=False)
            except pa.ArrowInvalid as err:
                raise UserError(
                    f"task.target '{target}' is binary but its values do not read as booleans: {err}"
                ) from None
            return torch.from_numpy(np.asarray(values, dtype=np.float32)), torch.from_numpy(known)
        values = pc.cast(raw, pa.float64()).fill_null(math.nan).to_numpy(zero_copy_only=False)
        present = known & np.isfinite(values)
        return torch.from_numpy(np.where(present, values, 0.0).astype(np.float32)), torch.from_numpy(present)

    # -- training ------------------------------------------------------------------------

    def stage(self, features: np.ndarray, labels: np.ndarray) -> Stage:
        """The next training pass over these rows, from the current ensemble's scores."""
        init = self.raw(features) if self.boosters else None
        return Stage(features, labels, init)

    def update(self, stage: Stage) -> None:
        """One boosting round of ``stage`` (the first builds its Dataset and Booster)."""
        if stage.booster is None:
            ds = lgb.Dataset(
                stage.features,
                label=stage.labels,
                init_score=stage.init,  # [rows] or [rows, classes]
                categorical_feature=list(self.flattening.categorical) or "auto",
                params={"verbose": -1},
                free_raw_data=True,
            )
            stage.booster = lgb.Booster(params=dict(self.params), train_set=ds)
            self.boosters.append(stage.booster)
        stage.finished = bool(stage.booster.update())  # as LightGBM's own loop, stop when it says so
        stage.rounds += 1

    # -- predicting ----------------------------------------------------------------------

    def raw(self, features: np.ndarray) -> np.ndarray:
        """The summed raw scores of every stage: ``[rows]``, or ``[rows, classes]``."""
        width = len(self.classes) if self.kind == "category" else 0
        out = np.zeros((features.shape[0], width) if width else features.shape[0])
        for b in self.boosters:
            out += np.asarray(b.predict(features, raw_score=True)).reshape(out.shape)
        return out

    def trees(self) -> int:
        return sum(b.num_trees() for b in self.boosters)

    def nodes(self) -> int:
        """Learned values: every split's threshold and every leaf's value, over all trees."""
        total = 0
        for b in self.boosters:
            for tree in b.dump_model()["tree_info"]:
                leaves = int(tree["num_leaves"])
                total += 2 * leaves - 1
        return total

    # -- checkpoint ----------------------------------------------------------------------

    def save(self, path: Path) -> None:
        doc = {
            "format": FORMAT,
            "kind": self.kind,
            "flattening": json.loads(self.flattening.to_json()),
            "classes": list(self.classes),
            "params": self.params,
            "boosters": [b.model_to_string() for b in self.boosters],
        }
        path.write_text(json.dumps(doc))

    @staticmethod
    def load(path: Path, spec: Spec) -> Ensemble:
        """A saved ensemble, for ``spec`` (its task kind must match); ``UserError`` otherwise."""
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise UserError(
                f"run.checkpoint {str(path)!r} is not a LightGBM checkpoint of this harness ({err}); "
                "give a model.library lightgbm run's .ckpt file"
            ) from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise UserError(f"run.checkpoint {str(path)!r} is not a LightGBM checkpoint of this harness ({FORMAT})")
        if doc["kind"] != spec.task.kind:
            raise UserError(
                f"run.checkpoint {str(path)!r} was trained for a {doc['kind']} task, the spec's task.kind is "
                f"{spec.task.kind}; give a checkpoint of this task"
            )
        fl = Flattening.from_json(json.dumps(doc["flattening"]))
        params = {**doc["params"], "num_threads": torch.get_num_threads()}
        boosters = [lgb.Booster(model_str=s) for s in doc["boosters"]]
        return Ensemble(doc["kind"], fl, tuple(doc["classes"]), params, boosters)


def _strings(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A target column as strings (dictionary-encoded and non-string categories alike)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    return pc.cast(arr, pa.string())
