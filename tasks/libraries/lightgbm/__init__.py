"""LightGBM 4.7.0 on flattened aggregates (``model.library: lightgbm``): the baseline RelBench
and RelArena report beside every relational model.

- ``checks``: what it cannot honour, from the spec alone (imports no lightgbm)
- ``features``: the nested row flattened into per-branch aggregates (Polars, columnar)
- ``booster``: the boosted ensemble (stages of LightGBM boosters), its labels, save and load
- ``side``: LightGBM inside the harness's chain: tensorize (the flattening), its engine (a
  training batch is one boosting round), predict per batch

See README.md in this folder for the features, the mapping and the measured findings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.libraries.lightgbm.checks import LIBRARY, check
from tasks.spec import Spec

if TYPE_CHECKING:
    import torch

    from tasks.libraries.base import ModelSide, Weights

__all__ = ["LIGHTGBM", "LightGBM"]


class LightGBM:
    """The ``Library`` (tasks/libraries/base.py) for LightGBM."""

    name = LIBRARY
    distribution: str | None = "lightgbm"
    packages: tuple[str, ...] = ("lightgbm",)
    model_floors = False  # trees, not the reference model's tensors and GEMMs
    own_checkpoint = True  # its stages' model strings and the flattening, one JSON file
    weight_formats: tuple[str, ...] = ()
    formats_module: str | None = None

    def check(self, spec: Spec) -> None:
        check(spec)

    def budget_grid(self, spec: Spec) -> None:
        return None  # its context is its branches' max_length and overflow

    def model_side(self, spec: Spec, device: torch.device, weights: Weights) -> ModelSide:
        from tasks.libraries.lightgbm.side import LightGBMSide  # imports lightgbm, Polars

        return LightGBMSide(spec, device)


LIGHTGBM = LightGBM()
