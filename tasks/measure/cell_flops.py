"""FLOPs of a model over padded contexts of cells (relational-transformers), present and padded.

Such a model runs every projection and feed-forward on every cell of a ``[contexts, cells]``
batch, its masked attentions on every pair of cells, and its head once per context, so one
forward over ``B`` contexts padded to ``L`` cells costs ``B * (linear*L + quadratic*L**2 +
constant)``. ``FlopModel`` holds those three numbers (fitted from torch's FlopCounterMode
counts, tasks/libraries/relational_transformers/driver.py); ``CellMoments`` holds the five sums
over a phase's steady batches that turn them into exact totals without keeping the batches:

- padded FLOPs: what the batches executed, each context at its batch's longest length;
- present FLOPs: what the same contexts would cost each at its own length (no padding), the
  useful work ``compute.mfu`` is about.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["CellMoments", "FlopModel"]


@dataclass(frozen=True)
class FlopModel:
    """One forward over one context padded to ``cells`` cells: ``linear*cells +
    quadratic*cells**2 + constant`` FLOPs."""

    linear: int
    quadratic: int
    constant: int

    def context(self, cells: int) -> int:
        return self.linear * cells + self.quadratic * cells * cells + self.constant

    @classmethod
    def fit(cls, counts: dict[int, int]) -> FlopModel | None:
        """From the counts of one context at 1, 2 and 3 cells; ``None`` when a fourth count
        (4 cells) breaks the form, i.e. the model is not this kind of model."""
        f1, f2, f3, f4 = (counts[n] for n in (1, 2, 3, 4))
        twice_quadratic = f3 - 2 * f2 + f1
        if twice_quadratic % 2:
            return None
        quadratic = twice_quadratic // 2
        linear = f2 - f1 - 3 * quadratic
        model = cls(linear, quadratic, f1 - linear - quadratic)
        return model if model.context(4) == f4 else None


@dataclass
class CellMoments:
    """Sums over batches of contexts: contexts, present cells and their squares, and padded
    cells (contexts x the batch's longest) and their squares."""

    contexts: int = 0
    cells: int = 0
    cells_squared: int = 0
    padded_cells: int = 0
    padded_cells_squared: int = 0

    def add(self, is_padding: torch.Tensor) -> None:
        """One batch, from its ``[contexts, cells]`` padding mask (one reduction)."""
        lengths = (~is_padding).sum(1)
        b, width = is_padding.shape
        self.contexts += b
        self.cells += int(lengths.sum())
        self.cells_squared += int((lengths * lengths).sum())
        self.padded_cells += b * width
        self.padded_cells_squared += b * width * width

    def present_flops(self, model: FlopModel) -> int:
        return model.linear * self.cells + model.quadratic * self.cells_squared + model.constant * self.contexts

    def padded_flops(self, model: FlopModel) -> int:
        return (
            model.linear * self.padded_cells
            + model.quadratic * self.padded_cells_squared
            + model.constant * self.contexts
        )
