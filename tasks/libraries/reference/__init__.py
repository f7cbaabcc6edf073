"""The reference model: our plain-PyTorch implementation of the product notes, in ``model/``.

It honours every spec setting (the spec was written for it), so its check refuses nothing.
Its side (side.py) encodes text cells with the harness's encoder, fits the encoding on the
first chunk and tensorizes (tasks/stages/encode.py, tensorize.py); its engine is engine.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.libraries.base import ModelSide, Weights
from tasks.spec import Spec

if TYPE_CHECKING:
    import torch

__all__ = ["REFERENCE", "Reference"]


class Reference:
    name = "reference"
    distribution: str | None = None
    packages: tuple[str, ...] = ()  # torch's version is tagged for every run
    model_floors = True
    own_checkpoint = False  # the harness's .ckpt format is the reference model's
    weight_formats: tuple[str, ...] = ()  # its .ckpt file is quantized by model/quantize.py, not a folder
    formats_module: str | None = None

    def check(self, spec: Spec) -> None:
        return None

    def budget_grid(self, spec: Spec) -> None:
        return None  # its context is its branches' max_length and overflow

    def model_side(self, spec: Spec, device: torch.device, weights: Weights) -> ModelSide:
        from tasks.libraries.reference.side import ReferenceSide  # the engine's imports: the backends

        return ReferenceSide(spec, device, weights)


REFERENCE = Reference()
