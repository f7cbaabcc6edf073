"""Stage 4, compute: the device a run computes on, and what every engine shares.

The compute step itself is the engine's (``EngineBase``, tasks/stages/engine.py): the chain
calls it for each chunk or request. The reference model's engine is
``tasks/libraries/reference/engine.py``, each library's beside it under ``tasks/libraries/``.
"""

from __future__ import annotations

import torch

from tasks.runtime.errors import UserError
from tasks.spec import Spec
from tasks.stages.engine import (
    PredictOutputs,
    compile_cache_counts,
    compiled_frames,
    graph_break_reasons,
    graph_breaks,
)

__all__ = [
    "PredictOutputs",
    "check_precision",
    "compile_cache_counts",
    "compiled_frames",
    "graph_break_reasons",
    "graph_breaks",
    "resolve_device",
]


def resolve_device(spec: Spec) -> torch.device:
    name = spec.run.device
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"run.device is '{name}' but CUDA is not available here; use run.device: cpu.")
    return dev


def check_precision(spec: Spec, device: torch.device) -> None:
    if spec.run.precision == "fp16" and device.type == "cpu":
        raise UserError(
            "run.precision fp16 is not supported on CPU; use bf16 (supported on CPU) or fp32, or run on a CUDA device."
        )
