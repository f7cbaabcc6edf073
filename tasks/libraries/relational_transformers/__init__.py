"""relational-transformers 0.1.0 (RelativeDB's RT-J) as a model under test: ``model.library:
relational_transformers``. See README.md beside this file for the mapping, the refusals and
what was measured.

- ``contexts``: the application's part, columnar: nested Arrow rows -> cells, node ids,
  foreign-key links, training-split normalisation (``fit_stats``, ``build_contexts``), the
  encode step (``encode``, ``hashing_encoder``), the library's ``RelationalBatch``
  (``collate``, ``plan_batches``, ``cells_present``, ``cells_padded``)
- ``driver``: the model per batch (``RTDriver``: predict, train step, save in five weight
  formats, FLOPs, ONNX export and ``OnnxDriver``), ``inspect_meta``
- ``checks``: ``check`` / ``refusals``, from the spec alone (no torch: the checks before work
  import this package, so the names of ``contexts`` and ``driver`` load on first use)
- ``side``: the library inside the harness's chain (its encode and tensorize steps, its engine)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tasks.libraries.relational_transformers.checks import LIBRARY, check, refusals
from tasks.spec import Spec

if TYPE_CHECKING:
    import torch

    from tasks.libraries.base import ModelSide, Weights
    from tasks.libraries.relational_transformers.contexts import (
        D_TEXT,
        ContextConfig,
        Contexts,
        Encoded,
        Stats,
        build_contexts,
        cells_padded,
        cells_present,
        collate,
        encode,
        fit_stats,
        hashing_encoder,
        plan_batches,
    )
    from tasks.libraries.relational_transformers.driver import (
        RT_J,
        FlopCount,
        MetaReport,
        ModelDims,
        OnnxDriver,
        RTDriver,
        SavedCheckpoint,
        inspect_meta,
    )

__all__ = [
    "D_TEXT",
    "LIBRARY",
    "RT_J",
    "ContextConfig",
    "Contexts",
    "Encoded",
    "FlopCount",
    "MetaReport",
    "ModelDims",
    "OnnxDriver",
    "RTDriver",
    "RELATIONAL_TRANSFORMERS",
    "RelationalTransformers",
    "SavedCheckpoint",
    "Stats",
    "build_contexts",
    "cells_padded",
    "cells_present",
    "check",
    "collate",
    "encode",
    "fit_stats",
    "hashing_encoder",
    "inspect_meta",
    "plan_batches",
    "refusals",
]


class RelationalTransformers:
    """The library as tasks.libraries' ``Library`` protocol sees it."""

    name = LIBRARY
    distribution: str | None = "relational-transformers"
    packages: tuple[str, ...] = ("relational-transformers",)
    model_floors = False
    own_checkpoint = True  # RTDriver.from_spec(checkpoint=): the library's config + safetensors folder
    weight_formats: tuple[str, ...] = ("fp16", "fp8", "int8", "int4")  # formats.py
    formats_module: str | None = "tasks.libraries.relational_transformers.formats"

    def check(self, spec: Spec) -> None:
        check(spec)

    def budget_grid(self, spec: Spec) -> dict[str, list[int]] | None:
        # The rt_utils builder's cell budget; the nested builder's context is its branches'.
        if spec.model.rt.context.builder != "rt_utils":
            return None
        return {"model.rt.context.max_context_cells": [128, 256, 512, 1024, 2048]}

    def model_side(self, spec: Spec, device: torch.device, weights: Weights) -> ModelSide:
        from tasks.libraries.relational_transformers.side import RTSide  # imports torch and the library

        return RTSide(spec, device)


RELATIONAL_TRANSFORMERS = RelationalTransformers()

_CONTEXTS = {
    "D_TEXT",
    "ContextConfig",
    "Contexts",
    "Encoded",
    "Stats",
    "build_contexts",
    "cells_padded",
    "cells_present",
    "collate",
    "encode",
    "fit_stats",
    "hashing_encoder",
    "plan_batches",
}


def __getattr__(name: str) -> Any:
    # The heavy names on first use: the checks before work import this package and must not
    # pay torch's import (seconds) to refuse a setting.
    if name in __all__ and name not in globals():
        import importlib

        module = "contexts" if name in _CONTEXTS else "driver"
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
