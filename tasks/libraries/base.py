"""The protocol every model under test implements (``model.library``).

The harness owns reading, preprocessing, timing, calibration and writing; a library owns
what is its own: which spec settings it can honour, turning the harness's nested Arrow
table into its inputs (the tensorize stage, and encode where it has one), and the model's
train and predict steps. Each library lives in one module or folder beside this file.
"""

from __future__ import annotations

import importlib.metadata as md
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from tasks.spec import Spec

if TYPE_CHECKING:
    import torch

    from model.arrow import Encoding
    from model.schema import ModelSchema
    from tasks.libraries.reference.engine import Engine
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
    # tensors, GEMMs at its shapes: tasks/run/floors.py) describe this library's work; a
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

    def budget_grid(self, spec: Spec) -> dict[str, list[int]] | None:
        """``relflow-bench budget``'s default grid when this library has a context budget of its
        own in ``spec`` (spec keys -> values); None: the grid is the branches' ``max_length``."""
        ...

    def model_side(self, spec: Spec, device: torch.device, weights: Weights) -> ModelSide:
        """This run's encode and tensorize steps and engine, starting from ``weights`` (the
        harness's checkpoint or bundle) or, with ``own_checkpoint``, from ``run.checkpoint``
        in the library's own format."""
        ...


def version_of(library: Library) -> str:
    """The installed version of ``library`` (the harness's own for the reference model)."""
    dist = library.distribution or "relflow-bench"
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "absent"


class SavedWeights(Protocol):
    """What a loaded checkpoint gives a run (tasks/backends/checkpoint.py ``LoadedCheckpoint``)."""

    model: dict[str, Any] | None
    optimizer: dict[str, Any] | None
    temperature: float
    encoding: Encoding
    schema: ModelSchema


@dataclass
class Weights:
    """Where a run's model starts: the harness's checkpoint or bundle, else fresh."""

    model: dict[str, Any] | None = None  # state dict
    optimizer: dict[str, Any] | None = None
    temperature: float = 1.0  # output calibration (1.0 = none)
    encoding: Encoding | None = None  # None: fitted on the first chunk
    schema: ModelSchema | None = None

    @staticmethod
    def of(checkpoint: SavedWeights | None) -> Weights:
        if checkpoint is None:
            return Weights()
        c = checkpoint
        return Weights(c.model, c.optimizer, c.temperature, c.encoding, c.schema)


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
    """A library's part of one run's chain (tasks/run/chain.py): read -> preprocess ->
    (``encode``) -> ``tensorize`` -> the compute stage through ``engine``. Tensorize fits what
    the model learns from data (a vocabulary, the encoding) on the first chunk, inside that
    step's time; ``engine`` is None until then."""

    encodes: bool  # an encode step of its own (its stage row), before tensorize
    # A training chunk's tensors hold every row of the chunk and serve every epoch: a one-chunk
    # workload keeps them, and counts its data figures from them (tasks/run/scenarios/workload.py).
    reuses_chunks: bool

    def encode(self, pre: Preprocessed, train: bool) -> Encoded:
        """The application's cell encoding, where the library leaves it to the application."""
        ...

    def tensorize(self, pre: Preprocessed, train: bool, encoded: Encoded | None) -> Chunk:
        """``train``: the chunk feeds training steps (a library may learn while encoding);
        ``encoded``: what this side's ``encode`` returned (None without an encode step)."""
        ...

    def engine(self, clock: Clock) -> EngineBase | None: ...

    def reference_inputs(self) -> tuple[Encoding, ModelSchema] | None:
        """The encoding and schema of ``model/``'s inputs once fitted or loaded (what its .ckpt
        saves; DDP ranks, the plain output-check pass and the floor ledger build on them);
        None for a library with inputs of its own."""
        ...

    def reference_engine(self) -> Engine | None:
        """The built engine where it is ``model/``'s: the paths only it has (serving through
        tasks/backends, DDP, the output check, the MLflow model, fp8 fallbacks); None for a
        library's own engine (``check`` refused those settings)."""
        ...


class OwnInputs:
    """The ``ModelSide`` members of a library whose inputs and engine are its own, not
    ``model/``'s: it encodes training rows per epoch, and has no reference-only path."""

    reuses_chunks = False

    def reference_inputs(self) -> None:
        return None

    def reference_engine(self) -> None:
        return None


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
