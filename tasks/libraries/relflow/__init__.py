"""relflow 0.4.0 as the model under test (``model.library: relflow``).

- ``checks``: what relflow cannot honour, decided from the spec alone (imports no relflow: the
  checks before work run it in about a second)
- ``mapping``: the harness's nested table as relflow reads it, and the relflow ``Model`` built
  from the spec
- ``driver``: what the engine calls per batch (encode, train step, predict, write) and the
  facts it reports (occupancy, packing, compiled region calls, throughput estimate, FLOPs)
- ``side``: relflow inside the chain: its tensorize step and its engine

See README.md in this folder for the mapping table and the measured findings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasks.libraries.relflow.checks import LIBRARY, check
from tasks.spec import Spec

if TYPE_CHECKING:
    import torch

    from tasks.libraries.base import ModelSide, Weights

__all__ = ["RELFLOW", "Relflow"]


class Relflow:
    """The ``Library`` (tasks/libraries/base.py) for relflow."""

    name = LIBRARY
    distribution: str | None = "relflow"
    packages: tuple[str, ...] = ("relflow", "lightning")
    model_floors = False
    own_checkpoint = True  # RelflowDriver.load: relflow's own checkpoint
    weight_formats: tuple[str, ...] = ()
    formats_module: str | None = None

    def check(self, spec: Spec) -> None:
        check(spec)

    def budget_grid(self, spec: Spec) -> None:
        return None  # its context is its branches' max_length and overflow

    def model_side(self, spec: Spec, device: torch.device, weights: Weights) -> ModelSide:
        from pathlib import Path

        from tasks.libraries.relflow.side import RelflowSide  # imports relflow (and Lightning)

        return RelflowSide(spec, device, Path(spec.run.checkpoint) if spec.run.checkpoint else None)


RELFLOW = Relflow()
