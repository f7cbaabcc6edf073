"""Compile regions: which sub-modules ``model.compile`` may wrap, and how.

A *region* is one node's branch sequence encoder stack (``encoders=True``) or one node's
learned attention reduction (``pools=True``). Everything else -- coordinate encoders,
routing between nodes, packing, mean pooling, heads, losses -- always runs eagerly.

Design choices:
- Selection is stored, compilation is lazy: ``torch.compile`` wraps a region's ``forward``
  the first time that region runs on real inputs while selected.
- A region runs compiled only if it is *stock* (every sub-module is exactly one of the
  library's own types, not a subclass or a user replacement) and has no hooks (module
  hooks anywhere inside it, or global module hooks). The check happens on every call, so
  hooks added after ``compile`` make the region eager from then on. The same "stock and
  hook-free" test gates packing (a hook must see the padded tensors it was written for).
- Always ``fullgraph=True``: a graph break or backend error propagates; there is no silent
  eager fallback.
- Inductor defaults keep eager random draws (``fallback_random``), disable CUDA graphs and
  automatic padding; user ``options`` override them. Options are only given to other
  backends when the user passes them.
- Compiled wrappers are per-model runtime state, never in ``state_dict`` and dropped by
  copy/pickle, so copies, checkpoint rebuilds and schema changes start eager.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _module

INDUCTOR_DEFAULTS: dict[str, Any] = {
    "fallback_random": True,
    "triton.cudagraphs": False,
    "comprehensive_padding": False,
    "shape_padding": False,
}


def has_hooks(module: nn.Module) -> bool:
    """True if the module, any sub-module, or the global module registry has hooks."""
    if (
        _module._global_forward_hooks
        or _module._global_forward_pre_hooks
        or _module._global_backward_hooks
        or _module._global_backward_pre_hooks
    ):
        return True
    return any(
        m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks for m in module.modules()
    )


def is_stock(module: nn.Module, stock_types: frozenset[type[nn.Module]]) -> bool:
    """True if every sub-module is exactly a library type (no subclass, no replacement)."""
    return all(type(m) in stock_types for m in module.modules())


def dropout_active(module: nn.Module) -> bool:
    if not module.training:
        return False
    for m in module.modules():
        if isinstance(m, nn.Dropout) and m.p > 0:
            return True
        rate = getattr(m, "dropout", None)
        if isinstance(rate, float) and rate > 0:
            return True
    return False


@dataclass(frozen=True)
class CompileSettings:
    encoders: bool
    pools: bool
    backend: str | Callable[..., Any] = "inductor"
    dynamic: bool | None = None
    options: dict[str, Any] | None = None
    mode: str | None = None  # torch.compile mode, e.g. "max-autotune-no-cudagraphs"

    def selects(self, kind: str) -> bool:
        return self.encoders if kind == "encoder" else self.pools

    def resolved_options(self) -> dict[str, Any] | None:
        if self.backend == "inductor":
            # torch.compile takes mode or options, not both: expand the mode into its options
            # (as torch does), then our defaults, then the caller's options win.
            from torch._inductor import list_mode_options

            by_mode = list_mode_options(self.mode, self.dynamic) if self.mode else {}
            return {**by_mode, **INDUCTOR_DEFAULTS, **(self.options or {})}
        return dict(self.options) if self.options else None

    def wrap(self, fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        compile_fn: Any = torch.compile  # options are Inductor config values of any type
        compiled: Callable[..., torch.Tensor] = compile_fn(
            fn,
            fullgraph=True,
            backend=self.backend,
            dynamic=self.dynamic,
            options=self.resolved_options(),
            **({"mode": self.mode} if self.mode and self.backend != "inductor" else {}),
        )
        return compiled


class RegionRunner:
    """Per-model compile state: the selection and the lazily built compiled wrappers."""

    def __init__(self) -> None:
        self.settings: CompileSettings | None = None
        self._compiled: dict[str, tuple[nn.Module, Callable[..., torch.Tensor]]] = {}
        self.ran_compiled: list[str] = []

    def select(self, settings: CompileSettings | None) -> None:
        self.settings = settings
        self._compiled = {}

    def callable_for(
        self, kind: str, name: str, module: nn.Module, stock_types: frozenset[type[nn.Module]]
    ) -> Callable[..., torch.Tensor]:
        settings = self.settings
        if settings is None or not settings.selects(kind):
            return module
        if not is_stock(module, stock_types) or has_hooks(module):
            return module  # customized or hooked regions stay eager (checked every call)
        key = f"{kind}:{name}"
        cached = self._compiled.get(key)
        if cached is None or cached[0] is not module:
            cached = (module, settings.wrap(module.forward))
            self._compiled[key] = cached
        self.ran_compiled.append(key)
        return cached[1]
