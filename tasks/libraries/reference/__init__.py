"""The reference model: our plain-PyTorch implementation of the product notes, in ``model/``.

It honours every spec setting (the spec was written for it), so its check refuses nothing;
its train/predict steps are ``tasks/stages/compute.py``'s ``Engine``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.libraries.base import ModelSide
from tasks.spec import Spec

if TYPE_CHECKING:
    import torch


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

    def model_side(self, spec: Spec, device: torch.device) -> ModelSide | None:
        return None


REFERENCE = Reference()
