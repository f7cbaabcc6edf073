"""The protocol every model under test implements (``model.library``).

The harness owns reading, preprocessing, timing, calibration and writing; a library owns
what is its own: which spec settings it can honour, turning the harness's nested Arrow
table into its inputs (the tensorize stage, and encode where it has one), and the model's
train and predict steps. Each library lives in one module or folder beside this file.
"""

from __future__ import annotations

import importlib.metadata as md
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from tasks.spec import Spec

if TYPE_CHECKING:
    import torch

    from tasks.measure.clock import Clock
    from tasks.sources.tables import Sources
    from tasks.stages.encode import Encoded
    from tasks.stages.engine import EngineBase
    from tasks.stages.preprocess import Preprocessed
    from tasks.stages.tensorize import Chunk


class Library(Protocol):
    """A model under test, as the checks before work see it. The harness asks these members
    wherever a library differs, and never tests a library's name; each is registered in one
    line (tasks/libraries/__init__.py ``LIBRARIES``)."""

    name: str  # the value of model.library
    distribution: str | None  # its PyPI distribution; None for the reference model in model/
    # The distributions the environment fingerprint tags (``relflow.<package>_version``) for this
    # library: its own and what it stands on (tasks/measure/environment.py).
    packages: tuple[str, ...]
    # Whether the floor ledger's tensorize and compute floors (a memcpy of the reference model's
    # tensors, GEMMs at its shapes: tasks/measure/floors.py) describe this library's work; a
    # library with other tensors and kernels publishes no floor for those stages.
    model_floors: bool
    # Whether its ModelSide loads ``run.checkpoint`` in the library's own format; False: the
    # harness's checkpoint loader (the reference model's format, tasks/backends/checkpoint.py).
    own_checkpoint: bool
    # The weight formats ``relflow-bench quantize`` writes this library's checkpoint folder in,
    # and the module that writes and measures them (``write_formats``, ``eval_set``,
    # ``probe_in_fresh_process``, ``compare``, ``checkpoint_dir``); () and None: no such folder.
    weight_formats: tuple[str, ...]
    formats_module: str | None

    def check(self, spec: Spec) -> None:
        """Raise ``UserError`` naming the library, the key and the fix for every setting of
        ``spec`` this library cannot honour; called before any data is read."""
        ...

    def model_side(self, spec: Spec, device: torch.device) -> ModelSide | None:
        """This run's tensorize step and engine (from ``run.checkpoint`` when set, in the
        library's own format); None for the reference model, whose steps the chain runs itself
        (tasks/stages/tensorize.py, tasks/stages/compute.py)."""
        ...


def version_of(library: Library) -> str:
    """The installed version of ``library`` (the harness's own for the reference model)."""
    dist = library.distribution or "relflow-bench"
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "absent"


@dataclass(frozen=True)
class Unsupported:
    """One spec setting a library cannot honour, and what to do instead."""

    key: str
    value: object
    why: str
    fix: str

    def message(self, library: str) -> str:
        return f"model.library {library} cannot honour {self.key}={self.value!r}: {self.why}; {self.fix}."


class ModelSide(Protocol):
    """A library's part of one run's chain: its tensorize step and its engine.

    The chain (tasks/stages/chain.py) runs read -> preprocess -> (encode) for every library;
    then ``tensorize`` turns the preprocessed nested rows into the library's inputs (fitting
    what the library learns from data, e.g. vocabularies or normalisation, on the first chunk
    that arrives, inside that step's time as for the reference model), and ``engine`` builds
    the compute engine once that fit is done (None before)."""

    encodes: bool  # an encode step of its own (its stage row), before tensorize

    def encode(self, pre: Preprocessed, train: bool) -> Encoded:
        """The application's cell encoding, where the library leaves it to the application."""
        ...

    def tensorize(self, pre: Preprocessed, train: bool, encoded: Encoded | None) -> Chunk:
        """``train``: the chunk feeds training steps (a library may learn while encoding);
        ``encoded``: what this side's ``encode`` returned (None without an encode step)."""
        ...

    def engine(self, clock: Clock) -> EngineBase | None: ...


@runtime_checkable
class ReadsSources(Protocol):
    """A side that reads the source tables itself, beside the chain's chunks (relational-
    transformers' ``rt_utils`` contexts span the whole foreign-key graph, not one chunk's nested
    rows); the chain hands it the run's sources once, before any step."""

    def read_sources(self, sources: Sources) -> None: ...


def harness_problems(spec: Spec) -> list[Unsupported]:
    """Settings whose harness path exists only for the reference model (``model/``): a
    library under test runs through ``tasks/libraries/engine.py``, which has none of them."""
    run, out = spec.run, list[Unsupported]()
    fix = "use model.library: reference for it, or leave the setting at its default"
    if spec.task.branch is not None:
        out.append(
            Unsupported(
                "task.branch",
                spec.task.branch,
                "a library's predictions are one per root row here (a per-branch-row target is the reference model's)",
                "predict a root column, or " + fix,
            )
        )
    for name in spec.task.outputs:
        if name != "prediction" and not name.startswith("topk:"):
            out.append(
                Unsupported(
                    "task.outputs", name, "the harness writes a library's prediction and top-k only", "remove it"
                )
            )
    if run.distributed is not None:
        out.append(Unsupported("run.distributed", "set", "DDP training runs the reference model's engine", fix))
    if run.reference_checkpoint:
        out.append(
            Unsupported(
                "run.reference_checkpoint",
                run.reference_checkpoint,
                "the fp16 reference pass loads the reference model's checkpoint format",
                fix,
            )
        )
    if run.check_outputs:
        out.append(
            Unsupported(
                "run.check_outputs", True, "the plain comparison pass is the reference model's (padded, eager)", fix
            )
        )
    if run.loader.num_workers > 0:
        out.append(
            Unsupported(
                "run.loader.num_workers",
                run.loader.num_workers,
                "loader workers encode with the reference model's ArrowDataModule; a library's encode is the "
                "tensorize stage, in-process",
                "set run.loader.num_workers: 0",
            )
        )
    if run.compile.model:
        out.append(
            Unsupported("run.compile.model", True, "whole-model compilation wraps the reference model's forward", fix)
        )
    return out
