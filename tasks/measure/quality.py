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
