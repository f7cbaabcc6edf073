"""Encoded model batches: what the tensorize stage produces and the model consumes.

Padded layout. For a node at depth d the leading dims are ``[B, L1, ..., Ld]`` (``B`` root
rows; the root itself has just ``[B]``). Present rows of a branch are a *prefix* of its
reserved slots (the preprocess stage orders, then truncates), and a child row can only be
present under a present parent row, so padding and structurally skipped rows are simply
``present == False``.

Per node, with ``R`` = the leading dims:
- ``present_R``        bool   row exists (not padding / not structurally skipped)
- ``continuous_RC``    float  standardised numeric and timestamp values, 0.0 where null
- ``continuous_null_RC`` bool value is null (a present *null coordinate*)
- ``categorical_RK``   int64  category index; 0 = null, 1 = unknown, >= 2 vocabulary
- ``text_RXE``         float  (nodes with text columns only) each text cell's vector from the
                             application's encoder, 0.0 where null; ``None`` otherwise
- ``text_null_RX``     bool   text cell is null (a present null coordinate); ``None`` likewise

Branch dims may be shorter than reserved (length bucketing trims a batch to its own longest
instance per branch); a node's leading dims always equal its parent's rows.

Target (in one node): ``labels_R`` (int64 class index, or float for binary/regression) and
``label_present_R`` (row present and label not null: these rows count in loss and quality).
A category label whose class the fit never saw (no class index: the model cannot predict it)
is ``UNSEEN_CLASS`` with ``label_present`` false: no loss or calibration uses it, and quality
counts it as a wrong prediction (tasks/measure/quality.py), never drops it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

# The label index of a held-out category value outside the classes learned at fit time (every
# library's labels use it: the reference's encoding, relflow's vocabulary, RT's statistics).
UNSEEN_CLASS = -1


@dataclass
class NodeTensors:
    present: torch.Tensor  # bool [R]
    continuous: torch.Tensor  # float32 [R, C]
    continuous_null: torch.Tensor  # bool [R, C]
    categorical: torch.Tensor  # int64 [R, K]
    text: torch.Tensor | None = None  # float32 [R, X, E], nodes with text columns only
    text_null: torch.Tensor | None = None  # bool [R, X]

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> NodeTensors:
        changes: dict[str, Any] = {
            f.name: None if getattr(self, f.name) is None else fn(getattr(self, f.name)) for f in fields(self)
        }
        return replace(self, **changes)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> NodeTensors:
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> NodeTensors:
        return self._map(lambda t: t.pin_memory())

    def select(self, index: torch.Tensor) -> NodeTensors:
        """Rows ``index`` of the batch dimension."""
        return self._map(lambda t: t[index])


@dataclass
class Batch:
    nodes: dict[str, NodeTensors]
    labels: torch.Tensor  # [R_target] int64 (category) or float32 (binary, regression)
    label_present: torch.Tensor  # bool [R_target]

    @property
    def size(self) -> int:
        return int(next(iter(self.nodes.values())).present.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(
            nodes={k: v.to(device, non_blocking) for k, v in self.nodes.items()},
            labels=self.labels.to(device, non_blocking=non_blocking),
            label_present=self.label_present.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> Batch:
        return Batch(
            nodes={k: v.pin_memory() for k, v in self.nodes.items()},
            labels=self.labels.pin_memory(),
            label_present=self.label_present.pin_memory(),
        )

    def select(self, index: torch.Tensor) -> Batch:
        """Root rows ``index`` (a slice of the batch: every node is cut the same way)."""
        return Batch(
            nodes={k: v.select(index) for k, v in self.nodes.items()},
            labels=self.labels[index],
            label_present=self.label_present[index],
        )
