"""Task quality on held-out (validation) rows, accumulated over chunks.

Besides the task metric, the majority-class rate (category) or the predict-the-mean error
(regression) is reported, so a reader can tell a model that learned from one that did not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from tasks.measure import keys as K


def _auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Rank-based ROC AUC (Mann-Whitney U), ties averaged."""
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    # average ranks over ties
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


@dataclass
class Quality:
    kind: str
    target_mean: float = 0.0
    target_std: float = 1.0
    _pred: list[np.ndarray] = field(default_factory=list)
    _label: list[np.ndarray] = field(default_factory=list)

    def add(self, prediction: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> None:
        """``prediction``: logits [..., C] (category) or [...] (binary logit / regression)."""
        mask = mask.bool()
        if self.kind == "category":
            pred = prediction.float().argmax(-1)[mask]
        else:
            pred = prediction.float()[mask]
        self._pred.append(pred.cpu().numpy())
        self._label.append(labels[mask].cpu().numpy())

    def metrics(self) -> dict[str, float]:
        if not self._pred:
            return {}
        pred, label = np.concatenate(self._pred), np.concatenate(self._label)
        out = {"rows": float(len(label))}
        if len(label) == 0:
            return out
        if self.kind == "category":
            out["accuracy"] = float((pred == label).mean())
            out["majority_rate"] = float(np.bincount(label.astype(np.int64)).max() / len(label))
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
