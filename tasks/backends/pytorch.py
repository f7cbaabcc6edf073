"""The PyTorch backend: the model's own forward (eager, regions or whole-model compiled).

``run.compile.model`` wraps the whole model in ``torch.compile(dynamic=True)`` (the seed
note's ``compile=True``). Unlike the regions it is not ``fullgraph``: the packed path's host
sync (grouping instances by present-row count with ``torch.unique(...).tolist()``) breaks
the graph once per packed node, and the compute stage counts breaks and recompiles per
phase instead of hiding them. (The eager category-index check, another host sync, becomes a
masked op under compile; see ``RelationalTransformer._node_rows``.)
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

from model import RelationalTransformer
from model.batch import Batch
from model.quantize import fp8_fallback_calls
from model.regions import CompileSettings


def whole_model(
    model: RelationalTransformer, backend: str, options: dict[str, Any] | None = None, mode: str | None = None
) -> Callable[..., Any]:
    """``torch.compile(model, dynamic=True)`` with the regions' Inductor defaults, mode and
    options (``run.compile.backend|mode|options`` apply to the whole model too)."""
    settings = CompileSettings(encoders=False, pools=False, backend=backend, dynamic=True, options=options, mode=mode)
    compile_fn: Any = torch.compile  # options are Inductor config values of any type
    compiled: Callable[..., Any] = compile_fn(
        model,
        dynamic=True,
        backend=backend,
        options=settings.resolved_options(),
        **({"mode": mode} if mode and backend != "inductor" else {}),
    )
    return compiled


class PyTorchBackend:
    name = "pytorch"

    def __init__(
        self,
        model: RelationalTransformer,
        forward: Callable[..., Any],
        autocast: Callable[[], AbstractContextManager[Any]],
        weights_format: str = "fp32",
        weights_native: bool = True,
    ) -> None:
        self.model, self.forward, self.autocast = model, forward, autocast
        self.weights_format, self.weights_native = weights_format, weights_native

    def encoder_path(self) -> str:
        return getattr(self.model, "last_encoder_path", None) or "unknown"

    def step(self, batch: Batch, outputs: tuple[str, ...]) -> dict[str, torch.Tensor]:
        with self.autocast():
            out: dict[str, torch.Tensor] = self.forward(batch, outputs=outputs)
        return out

    def session_threads(self) -> int | None:
        return None  # torch's threads, whatever they are while it runs

    def tags(self) -> dict[str, str]:
        # native fp8 only if no call fell back to the dequantized weight (read after the passes)
        native = self.weights_native and not fp8_fallback_calls(self.model)
        return {
            "relflow.backend": self.name,
            "relflow.weights_format": self.weights_format,
            "relflow.weights_native": str(native).lower(),
        }
