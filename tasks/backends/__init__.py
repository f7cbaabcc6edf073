"""Serving backends behind the compute stage: one small interface, so the reference model's
engine (``tasks/libraries/reference/engine.py``) reads the same whatever runs the model.

A backend is created once per run (``load``: session creation, weight conversion; timed
outside every stage), then ``step(batch, outputs)`` runs one predict batch and returns the
selected outputs as CPU-or-device torch tensors. The compute stage times ``step`` exactly as
it times PyTorch (first call, warm-up, steady batches, exact rows).

- ``pytorch``: the model itself, eager, region-compiled or whole-model compiled
  (``run.compile.model``), under the run's autocast.
- ``onnxruntime``: an export bundle's ``model.onnx`` (or its dynamic int8 derivative) in an
  ``InferenceSession`` with the providers chosen at load time.

``session_threads``: the intra-op threads a backend's own session runs at, fixed when it was
created (ONNX Runtime, in the ``backend_setup`` bucket, before a request scenario switches
torch to ``run.request.intra_op_threads``); None for a backend that runs on torch's threads,
whatever they are while it runs. The run's MFU peak and floors use it
(``EngineBase.session_threads``, ``invocation.predict_threads``).
"""

from __future__ import annotations

from typing import Protocol

import torch

from model.batch import Batch


class Backend(Protocol):
    name: str

    def encoder_path(self) -> str: ...

    def step(self, batch: Batch, outputs: tuple[str, ...]) -> dict[str, torch.Tensor]: ...

    def tags(self) -> dict[str, str]: ...

    def session_threads(self) -> int | None: ...
