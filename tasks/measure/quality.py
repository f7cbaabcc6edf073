"""Task quality on held-out (validation) rows, accumulated over chunks.

Besides the task metric, the majority-class rate (category) or the predict-the-mean error
(regression) is reported, so a reader can tell a model that learned from one that did not.

``Quality.interval`` gives the headline figure an interval over the scored rows
(``quality.<headline>.ci_low|ci_high``): a percentile bootstrap (tasks/measure/stats.py
``cluster_bootstrap``) that resamples units with replacement: the entities of a RelBench task
(an entity's rows at several seed times move together, as they are not independent draws),
else the root rows. Each chunk's root keys come with its scores (``add(..., keys=)``); a
RelBench root key is ``"<entity>@<seed time>"``, so the entity is the key without its last
``@...``. The interval is about which test entities happened to be drawn, in this one run; the
variation between training runs is what repeated runs (``models-report --rounds``) show.

A held-out category label whose class the model never learned (``UNSEEN_CLASS``: the libraries
learn their classes from different chunks) is scored as a wrong prediction, never dropped, so
``quality.rows`` is the same held-out rows for every library (``quality.unseen_class_rows`` says
how many such rows there were); ``majority_rate`` is the commonest learned class's share of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from model.batch import UNSEEN_CLASS
from tasks.measure import keys as K
from tasks.measure.stats import CI_LEVEL, cluster_bootstrap

Keys: TypeAlias = pa.Array | pa.ChunkedArray | np.ndarray


def _auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC (torchmetrics), ties counted one half; NaN with one class only (torchmetrics
    would warn and return 0)."""
    # here: scipy.stats and torchmetrics take seconds to import, paid only where an AUC is scored
    from scipy.stats import rankdata
    from torchmetrics.functional.classification import binary_auroc

    pos = labels > 0.5
    if pos.all() or not pos.any():
        return float("nan")
    # torchmetrics reads scores outside [0, 1] as logits and applies a sigmoid, in the scores'
    # dtype: float32 logits beyond ~17 (float64 beyond ~37) all become 1.0, ties that change
    # the AUC. The AUC depends on the order only, so the scores go in as their dense ranks in (0, 1].
    dense = rankdata(scores, method="dense")
    ranked = torch.from_numpy(dense / dense.max())
    return float(binary_auroc(ranked, torch.from_numpy(pos.astype(np.int64))))


@dataclass
class Quality:
    kind: str
    target_mean: float = 0.0
    target_std: float = 1.0
    _pred: list[np.ndarray] = field(default_factory=list)
    _label: list[np.ndarray] = field(default_factory=list)
    _keys: list[np.ndarray | None] = field(default_factory=list)  # root key of each scored cell
    # ``keep``'s arguments, by reference, until ``settle`` scores them with ``add``
    _kept: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, Keys | None, torch.Tensor | None]] = field(
        default_factory=list
    )

    def keep(
        self,
        prediction: torch.Tensor,
        labels: torch.Tensor,
        mask: torch.Tensor,
        keys: Keys | None = None,
        scored: torch.Tensor | None = None,
    ) -> None:
        """``add``'s arguments kept by reference, scored by ``settle`` (or when a figure is
        read): a timed compute step keeps them, and the scoring (argmax, masks, host copies,
        the keys' conversion) runs after its timing. The tensors must not change meanwhile."""
        self._kept.append((prediction, labels, mask, keys, scored))

    def settle(self) -> None:
        """Score what ``keep`` kept, in the order it was kept."""
        kept, self._kept = self._kept, []
        for prediction, labels, mask, keys, scored in kept:
            self.add(prediction, labels, mask, keys, scored)

    def add(
        self,
        prediction: torch.Tensor,
        labels: torch.Tensor,
        mask: torch.Tensor,
        keys: Keys | None = None,
        scored: torch.Tensor | None = None,
    ) -> None:
        """``prediction``: logits [..., C] (category) or [...] (binary logit / regression);
        ``mask``: [B] or [B, ...] (a branch target's cells); ``keys``: the B root keys, so that
        the interval can resample whole entities (without them: every scored cell alone).
        ``scored``: the B held-out root rows; a category cell among them whose label is
        ``UNSEEN_CLASS`` (outside ``mask``, which holds known classes) is scored as wrong."""
        self.settle()  # what was kept before comes first
        mask = mask.bool()
        if self.kind == "category" and scored is not None:  # a class never learned: wrong, not dropped
            held_out = scored.bool().to(mask.device).view(-1, *([1] * (mask.dim() - 1)))
            mask = mask | ((labels.to(mask.device) == UNSEEN_CLASS) & held_out)
        if self.kind == "category" and prediction.shape[-1] == 0:  # no class learned at all
            pred = torch.full((int(mask.sum()),), UNSEEN_CLASS)  # never right (``_hits``)
        elif self.kind == "category":
            pred = prediction.float().argmax(-1)[mask]
        else:
            pred = prediction.float()[mask]
        self._pred.append(pred.cpu().numpy())
        self._label.append(labels[mask].cpu().numpy())
        if keys is None:
            self._keys.append(None)
            return
        # the root row of each scored cell, in the row-major order ``[mask]`` takes them
        rows = np.nonzero(mask.reshape(mask.shape[0], -1).cpu().numpy())[0]
        root = keys if isinstance(keys, np.ndarray) else keys.to_numpy(zero_copy_only=False)
        self._keys.append(np.asarray(root)[rows])

    def metrics(self) -> dict[str, float]:
        self.settle()
        if not self._pred:
            return {}
        pred, label = np.concatenate(self._pred), np.concatenate(self._label)
        out = {"rows": float(len(label))}
        if len(label) == 0:
            return out
        if self.kind == "category":
            seen = label >= 0  # the rest: classes the model never learned (``UNSEEN_CLASS``)
            out["accuracy"] = float(_hits(pred, label).mean())
            counts = np.bincount(label[seen].astype(np.int64)) if seen.any() else np.zeros(1)
            out["majority_rate"] = float(counts.max() / len(label))  # the commonest learned class
            out["unseen_class_rows"] = float((~seen).sum())
        elif self.kind == "binary":
            out["accuracy"] = float(((pred > 0) == (label > 0.5)).mean())
            out["auc"] = _auc(pred, label)
            out["majority_rate"] = float(max(label.mean(), 1 - label.mean()))
        else:
            err = (pred - label) * self.target_std
            out["mae"] = float(np.abs(err).mean())
            out["rmse"] = float(np.sqrt((err**2).mean()))
            out["mae_of_mean"] = float(np.abs((label - label.mean()) * self.target_std).mean())
        return out

    @property
    def headline(self) -> str:
        return K.HEADLINE_QUALITY[self.kind]

    def interval(self, by_entity: bool = False, level: float = CI_LEVEL) -> dict[str, float]:
        """``{"<headline>.ci_low": .., "<headline>.ci_high": ..}`` (``quality.`` keys once
        logged): the headline's bootstrap interval over the scored rows (module docstring).
        ``by_entity``: the keys are RelBench seed keys and their entities are the units; else
        each root row is one. Empty with fewer than two units, or without a finite interval."""
        self.settle()
        if not self._pred:
            return {}
        pred, label = np.concatenate(self._pred), np.concatenate(self._label)
        if len(label) < 2:
            return {}
        if any(k is None for k in self._keys):
            units = np.arange(len(label))
        else:
            units = np.concatenate([k for k in self._keys if k is not None])
            if by_entity:
                units = entities_of_seed_keys(units)
        if self.kind == "binary":  # rows in score order: the AUC's resamples need no reordering
            order = np.argsort(pred, kind="stable")
            pred, label, units = pred[order], label[order], units[order]
        got = cluster_bootstrap(self._statistic(pred, label), units, level)
        if got is None:
            return {}
        return {K.quality_ci_name(self.headline, b): v for b, v in zip(K.QUALITY_CI_BOUNDS, got, strict=True)}

    def _statistic(self, pred: np.ndarray, label: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        """The headline as a function of row weights [resamples, rows] (1.0 each: ``metrics()``'s)."""
        if self.kind == "binary":
            return weighted_auc(pred, label)
        if self.kind == "category":
            score = _hits(pred, label).astype(np.float64)
        else:
            score = np.abs((pred - label) * self.target_std).astype(np.float64)  # the absolute error
        return lambda w: (w @ score) / w.sum(axis=1)


def _hits(pred: np.ndarray, label: np.ndarray) -> np.ndarray:
    """Category rows predicted right: an ``UNSEEN_CLASS`` label never is."""
    return np.asarray((pred == label) & (label >= 0))


def entities_of_seed_keys(keys: np.ndarray) -> np.ndarray:
    """The entity part of RelBench seed keys ``"<entity>@<YYYY-MM-DDTHH:MM:SS>"`` (the key
    without its last ``@...``; an entity that holds ``@`` itself keeps it)."""
    return np.asarray(
        pc.replace_substring_regex(pa.array(keys, pa.string()), "@[^@]*$", "").to_numpy(zero_copy_only=False)
    )


def weighted_auc(scores: np.ndarray, labels: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """ROC AUC with row weights, ties counted one half (``_auc`` with every weight 1): the
    weighted share of (positive, negative) pairs ordered right. The rows are sorted once; each
    call sums the weights per distinct score: [resamples, rows] -> [resamples]."""
    order = np.argsort(scores, kind="stable")
    s, pos = np.asarray(scores)[order], (np.asarray(labels) > 0.5)[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])  # each run of tied scores
    ordered = bool(np.all(order == np.arange(len(order))))

    def auc(weights: np.ndarray) -> np.ndarray:
        w = weights if ordered else weights[:, order]
        p = np.add.reduceat(w * pos, starts, axis=1)
        n = np.add.reduceat(w * ~pos, starts, axis=1)
        below = np.cumsum(n, axis=1) - n  # negative weight at lower scores
        pairs = p.sum(axis=1) * n.sum(axis=1)
        out: np.ndarray = (p * (below + 0.5 * n)).sum(axis=1) / pairs  # NaN with one class
        return out

    return auc
