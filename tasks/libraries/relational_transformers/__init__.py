"""relational-transformers 0.1.0 (RelativeDB's RT-J) as a model under test: ``model.library:
relational_transformers``. See README.md beside this file for the mapping, the refusals and
what was measured.

- ``contexts``: the application's part, columnar: nested Arrow rows -> cells, node ids,
  foreign-key links, training-split normalisation (``fit_stats``, ``build_contexts``), the
  encode step (``encode``, ``hashing_encoder``), the library's ``RelationalBatch``
  (``collate``, ``plan_batches``, ``cells_present``, ``cells_padded``)
- ``driver``: the model per batch (``RTDriver``: predict, train step, save in five weight
  formats, FLOPs, ONNX export and ``OnnxDriver``), ``inspect_meta``, ``check``
"""

from __future__ import annotations

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
    LIBRARY,
    RT_J,
    FlopCount,
    MetaReport,
    ModelDims,
    OnnxDriver,
    RTDriver,
    SavedCheckpoint,
    check,
    inspect_meta,
    refusals,
)
from tasks.spec import Spec

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

    def check(self, spec: Spec) -> None:
        check(spec)
