"""Precision: ``fp32 | bf16 | fp16`` through autocast.

- ``fp32``: no autocast (a null context).
- ``bf16``: ``torch.autocast(device_type, torch.bfloat16)``; works on CPU and CUDA.
- ``fp16``: CUDA only (CPU fp16 autocast is slow, partial and not what the runs measure),
  so asking for it elsewhere is a ``ValueError`` with the fix, not a silent change.
Loss computation upcasts to fp32 inside ``RelationalTransformer.loss``.
"""

from __future__ import annotations

import contextlib
from typing import Literal

import torch

Precision = Literal["fp32", "bf16", "fp16"]
PRECISIONS = ("fp32", "bf16", "fp16")


def autocast_context(device: torch.device | str, precision: Precision) -> contextlib.AbstractContextManager[None]:
    device = torch.device(device)
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {PRECISIONS}")
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "fp16" and device.type != "cuda":
        raise ValueError(
            f"precision='fp16' needs a CUDA device, the model is on {device.type!r}; use "
            "precision='bf16' (supported on CPU) or 'fp32'"
        )
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)
