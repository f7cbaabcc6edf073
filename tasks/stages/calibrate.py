"""Output calibration: temperature scaling, fitted after training, applied when predicting.

One scalar ``T`` divides the logits of category (softmax) and binary (sigmoid) targets; it
is fitted on the *fit* half of the held-out rows (tasks/stages/split.py:
``calibration_fit_rows``, a stable hash of the root key) by minimising the negative
log-likelihood over ``log T``
(so ``T`` stays positive), stored in the run checkpoint and applied in every predict path as
the timed step ``calibrate``. Argmax, and so accuracy and AUC, do not change; probabilities
do. Regression targets have nothing to calibrate: the step is the identity (``T = 1``).

``CalibrationQuality`` measures probability quality before (``T = 1``) and after
calibration on the other, *report* half of the held-out rows (never the rows ``T`` was
fitted on, so the calibrated figures are out of sample): NLL, ECE (torchmetrics' top-label
calibration error over 15 equal-width confidence bins) and the Brier score in its one, multi-class definition,
``mean over rows of sum over classes (p_c - y_c)^2`` (range 0..2), for every kind: a binary
target counts both classes, so its value is twice the one-class ``(p - y)^2`` some tools
report, and a 2-class category target gets the same number as the same binary target.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tasks.stages.engine import EngineBase, PredictOutputs
from tasks.stages.tensorize import Chunk

ECE_BINS = 15
CALIBRATED_KINDS = ("category", "binary")


def apply(logits: torch.Tensor, temperature: float, kind: str) -> torch.Tensor:
    """Calibrated logits (the identity for regression or ``T = 1``)."""
    if kind not in CALIBRATED_KINDS or temperature == 1.0:
        return logits
    return logits / temperature


def probabilities(logits_N: torch.Tensor, kind: str) -> torch.Tensor:
    """[N, C] class probabilities; a binary logit becomes [N, 2] (negative, positive)."""
    if kind == "binary":
        p = torch.sigmoid(logits_N.double())
        return torch.stack([1 - p, p], dim=-1)
    return torch.softmax(logits_N.double(), dim=-1)


def _labels(labels_N: torch.Tensor, kind: str) -> torch.Tensor:
    return (labels_N > 0.5).long() if kind == "binary" else labels_N.long()


def nll(logits_N: torch.Tensor, labels_N: torch.Tensor, kind: str, temperature: float = 1.0) -> float:
    x = logits_N.double() / temperature
    if kind == "binary":
        return float(torch.nn.functional.binary_cross_entropy_with_logits(x, (labels_N > 0.5).double()))
    return float(torch.nn.functional.cross_entropy(x, labels_N.long()))


def ece(probs_NC: torch.Tensor, labels_N: torch.Tensor, bins: int = ECE_BINS) -> float:
    """Expected calibration error of the top label (torchmetrics, L1): |accuracy - confidence|
    per confidence bin, weighted by the bin's rows; bins ``[k/bins, (k+1)/bins)``, a
    confidence of exactly 1 in a bin of its own."""
    # here: torchmetrics takes seconds to import, paid only where calibration is scored
    from torchmetrics.functional.classification import multiclass_calibration_error

    if probs_NC.shape[0] == 0:
        return float("nan")
    return float(
        multiclass_calibration_error(probs_NC, labels_N, num_classes=probs_NC.shape[-1], n_bins=bins, norm="l1")
    )


def brier(probs_NC: torch.Tensor, labels_N: torch.Tensor) -> float:
    """Brier score, one definition for every kind: the mean over rows of the squared error
    summed over classes (a binary target's [N, 2] probabilities count both classes).
    torchmetrics (1.9) has no Brier score, and scikit-learn's halves a 2-column one (its
    one-class binary form), which would break the one definition; this line is the definition."""
    onehot = torch.nn.functional.one_hot(labels_N, probs_NC.shape[-1]).double()
    return float(((probs_NC - onehot) ** 2).sum(-1).mean())


def scores(logits_N: torch.Tensor, labels_N: torch.Tensor, kind: str, temperature: float) -> dict[str, float]:
    probs = probabilities(logits_N.double() / temperature, kind)
    y = _labels(labels_N, kind)
    return {"nll": nll(logits_N, labels_N, kind, temperature), "ece": ece(probs, y), "brier": brier(probs, y)}


def fit_errors(logits_N: torch.Tensor, labels_N: torch.Tensor, kind: str) -> int:
    """Rows whose top class (binary: side of 0.5) is not their label."""
    if kind == "binary":
        return int(((logits_N > 0) != (labels_N > 0.5)).sum())
    return int((logits_N.argmax(-1) != labels_N.long()).sum())


def fit_temperature(logits_N: torch.Tensor, labels_N: torch.Tensor, kind: str, max_iter: int = 100) -> float:
    """The ``T`` that minimises NLL on these rows (1.0 when there is nothing to fit).

    Rows with no wrong top class have no finite minimiser: sharpening lowers their NLL all the
    way to ``T -> 0``, and the optimiser stops wherever its tolerances do (T 0.016 on the
    default workload at batch 128), which then multiplies every held-out mistake's margin by
    ~60 (report NLL 0.0097 -> 0.234). Such a fit keeps ``T = 1``: ``calibration.fit_errors``
    says why."""
    if kind not in CALIBRATED_KINDS or logits_N.shape[0] == 0 or fit_errors(logits_N, labels_N, kind) == 0:
        return 1.0
    x = logits_N.detach().double()
    y = labels_N.detach()
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.5, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        z = x / log_t.exp()
        if kind == "binary":
            loss = torch.nn.functional.binary_cross_entropy_with_logits(z, (y > 0.5).double())
        else:
            loss = torch.nn.functional.cross_entropy(z, y.long())
        loss.backward()
        return loss

    opt.step(closure)
    t = float(log_t.detach().exp())
    # Guard against a degenerate fit (e.g. all rows one class and separable): never worse.
    return t if nll(x, y, kind, t) <= nll(x, y, kind, 1.0) else 1.0


@torch.no_grad()
def validation_logits(engine: EngineBase, tz: Chunk) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw prediction logits and labels of a chunk's held-out, labelled cells of the fit
    half (``calibration_fit_rows``), computed with the engine's model but outside its
    timings (this is fitting, not serving)."""
    rows = torch.nonzero(tz.is_fit).flatten()
    if rows.numel() == 0:
        return torch.empty(0), torch.empty(0)
    return engine.validation_logits(tz, rows)


@dataclass
class CalibrationQuality:
    """Held-out logits and labels over chunks/requests -> before/after quality metrics."""

    kind: str
    temperature: float = 1.0
    _logits: list[torch.Tensor] = field(default_factory=list)
    _labels: list[torch.Tensor] = field(default_factory=list)

    def add(self, raw_logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> None:
        """``raw_logits`` before calibration; ``mask`` selects held-out, labelled cells."""
        if self.kind not in CALIBRATED_KINDS:
            return
        mask = mask.bool()
        self._logits.append(raw_logits.detach().float()[mask].cpu())
        self._labels.append(labels[mask].cpu())

    def begin_pass(self) -> None:
        """Scored on one predict pass (the latest), as ``quality.*``: repeats add no rows."""
        self._logits.clear()
        self._labels.clear()

    @property
    def rows(self) -> int:
        """Labelled cells scored (``calibration.report_rows``)."""
        return sum(int(x.shape[0]) for x in self._logits)

    def metrics(self) -> dict[str, float]:
        """``quality.*`` suffixes: ``nll|ece|brier`` calibrated (what is served) and
        ``uncalibrated.nll|ece|brier`` (``T = 1``)."""
        if not self._logits:
            return {}
        x, y = torch.cat(self._logits), torch.cat(self._labels)
        if x.shape[0] == 0:
            return {}
        out = {f"uncalibrated.{k}": v for k, v in scores(x, y, self.kind, 1.0).items()}
        out.update(scores(x, y, self.kind, self.temperature))
        return out


def report_mask(is_fit: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``mask`` (scored, labelled cells, [B, ...]) narrowed to the rows the temperature was not
    fitted on (``is_fit`` [B], tasks/stages/split.py)."""
    report = ~is_fit.to(mask.device)
    return mask.bool() & report.view(-1, *([1] * (mask.dim() - 1)))


def calibrate_outputs(outs: PredictOutputs, temperature: float, kind: str) -> PredictOutputs:
    """The ``calibrate`` step: the served prediction logits divided by ``T``."""
    if kind not in CALIBRATED_KINDS or temperature == 1.0:
        return outs
    outs.tensors["prediction"] = apply(outs.tensors["prediction"], temperature, kind)
    return outs
