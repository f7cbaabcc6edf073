"""The AdamW factory: ``model.optimizer = adamw(learning_rate=1e-3)``, then ``build(model)``.

Design choices:
- ``adamw(...)`` returns a frozen ``AdamW`` settings object, not an optimizer: settings are
  plain data (comparable, saved in checkpoints, checked on resume) and ``build(model)``
  makes the ``torch.optim.AdamW`` over that model's parameters.
- Two parameter groups: no weight decay for biases, one-dimensional parameters and any
  parameter whose name contains "norm"; ``weight_decay`` for the rest.
- ``fused=True`` (default) asks for Torch's fused kernel. It exists for CUDA and, since
  Torch 2.4, for CPU (verified on 2.13: fused CPU AdamW steps fine), so the default works
  on CPU as is. If Torch still rejects fused for the parameters' device, ``build`` falls
  back to ``fused=None`` (Torch's choice) with a warning. ``fused=False`` forces the
  for-each/loop implementation, ``fused=None`` lets Torch choose.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn


def no_decay(name: str, param: torch.Tensor) -> bool:
    return name.endswith("bias") or param.ndim <= 1 or "norm" in name.lower()


@dataclass(frozen=True)
class AdamW:
    learning_rate: float = 1e-3
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    fused: bool | None = True

    def __post_init__(self) -> None:
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate={self.learning_rate} must be > 0")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay={self.weight_decay} must be >= 0")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))

    def settings(self) -> dict[str, Any]:
        """JSON-like settings, as stored in checkpoints and compared on resume."""
        out = asdict(self)
        out["betas"] = list(self.betas)
        return out

    def param_groups(self, model: nn.Module) -> list[dict[str, Any]]:
        decay: list[nn.Parameter] = []
        keep: list[nn.Parameter] = []
        for name, param in model.named_parameters():
            if param.requires_grad:
                (keep if no_decay(name, param) else decay).append(param)
        return [
            {"params": decay, "weight_decay": self.weight_decay},
            {"params": keep, "weight_decay": 0.0},
        ]

    def build(self, model: nn.Module) -> torch.optim.AdamW:
        groups = self.param_groups(model)
        lr, betas, eps = self.learning_rate, self.betas, self.eps
        try:
            return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=self.fused)
        except RuntimeError as err:
            if not self.fused:
                raise
            warnings.warn(
                f"fused AdamW is not supported here ({err}); using fused=None (Torch's "
                "choice). Pass fused=False or fused=None to silence this.",
                stacklevel=2,
            )
            return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=None)


def adamw(
    learning_rate: float = 1e-3,
    weight_decay: float = 0.01,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    fused: bool | None = True,
) -> AdamW:
    return AdamW(learning_rate, weight_decay, (betas[0], betas[1]), eps, fused)
