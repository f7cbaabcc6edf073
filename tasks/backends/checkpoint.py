"""Run checkpoints: the model package's checkpoint plus the harness's fitted encoding.

``train+predict`` saves one next to the predictions (and logs it to MLflow); ``predict``
with ``run.checkpoint`` loads its weights; ``train+predict`` with ``run.checkpoint``
resumes training from it: weights, fitted encoding and optimizer state, with the optimizer
settings required to equal the saved run's (a difference is refused, naming the keys).
A checkpoint whose schema or model size does not match
the spec is refused up front with the difference named, and so is one trained with another
train/held-out split (``task.validation_fraction`` or the split's hash, recorded as
``split``: tasks/stages/split.py), whose held-out rows would include rows it trained on.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil
import torch

from model import RelationalTransformer, adamw
from model.arrow import Encoding, NodeLayout
from model.checkpoint import load_checkpoint, save_checkpoint
from model.config import ModelConfig
from model.optim import AdamW
from model.schema import ModelSchema, NodeDef
from tasks.backends.lengths import spec_for_saved
from tasks.measure.clock import Clock
from tasks.measure.records import CheckpointLoad
from tasks.runtime.errors import UserError
from tasks.runtime.writes import named_write_errors
from tasks.spec import Spec
from tasks.stages.split import check_split, split_record
from tasks.stages.tensorize import layout


def _shape(node: NodeDef) -> list[Any]:
    return [node.name, [c.name for c in node.columns], node.max_length, node.reduce, [_shape(c) for c in node.children]]


def optimizer_settings(spec: Spec) -> AdamW:
    """The run's AdamW settings (``run.learning_rate`` and ``run.adamw``): the engine trains
    with them, and a resumed run must match the saved ones."""
    a = spec.run.adamw
    return adamw(learning_rate=spec.run.learning_rate, weight_decay=a.weight_decay, fused=a.fused)


class Trained(Protocol):
    """What a checkpoint saves of the reference model's engine (tasks/libraries/reference/engine.py)."""

    @property
    def model(self) -> RelationalTransformer: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer | None: ...
    @property
    def optimizer_settings(self) -> AdamW: ...
    @property
    def temperature(self) -> float: ...


def save_run_checkpoint(path: Path, engine: Trained, enc: Encoding, spec: Spec) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with named_write_errors(path, "the run's checkpoint", "run.output_dir"):
            save_checkpoint(
                tmp,
                engine.model,
                optimizer=engine.optimizer,
                optimizer_settings=engine.optimizer_settings,
                extra={
                    "encoding": enc.to_dict(),
                    "spec_hash": spec.spec_hash,
                    "temperature": float(engine.temperature),
                    # which root rows it trained on: predict/resume/reference runs check it
                    "split": split_record(spec),
                },
            )
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_error_reason(path: Path, err: BaseException) -> str:
    """Why ``path`` could not be loaded as a checkpoint, in words (torch's own text misleads:
    an empty file gives an empty message, a pickle of Python objects suggests
    ``weights_only=False``, which would run whatever the file holds, and a zip that is no
    checkpoint asks for an enhancement request to PyTorch). torch's text is passed on only
    when it is none of those."""
    text = str(err).strip()
    if "weights_only" in text and "GLOBAL" in text:  # torch's safe loader met a Python object
        return (
            "the file is not a relflow checkpoint and is refused for safety: it holds pickled "
            "Python objects, and loading them could run arbitrary code"
        )
    size = path.stat().st_size if path.is_file() else None
    if size == 0:
        return "the file is empty (0 bytes): the run that wrote it did not finish"
    unreadable = isinstance(err, EOFError | KeyError | pickle.UnpicklingError) or not text
    # "weights_only" never reaches the user (its advice would run the file's code); a zip
    # without torch's records is not a checkpoint whatever torch says about it
    if unreadable or "weights_only" in text or "hasRecord" in text or "PytorchStreamReader" in text:
        shown = "" if size is None else f"{size:,} bytes; "
        return f"it is not a relflow checkpoint, or it is truncated ({shown}{type(err).__name__})"
    return text


def check_matches_spec(schema: ModelSchema, config: ModelConfig, spec: Spec, what: str) -> None:
    """Refuse a model whose schema or size differs from the spec's, naming the difference.
    Reserved lengths are compared after the rule every loader applies (a saved length up to
    max_length is the run's: tasks/backends/lengths.py), so a run's own checkpoint is accepted
    under the spec that trained it."""
    lay = layout(spec_for_saved(spec, schema))

    def spec_shape(n: NodeLayout) -> list[Any]:
        return [n.name, list(n.columns), n.max_length, n.reduce, [spec_shape(c) for c in n.children]]

    want = spec_shape(lay)
    have = _shape(schema.root)
    have[2], have[3] = want[2], want[3]  # the root's length and reduce carry no meaning
    if have != want or schema.target.column != spec.task.target:
        raise UserError(
            f"{what} was trained on a different schema: checkpoint {have} vs "
            f"spec {want} (a saved length may be below a branch's max_length, never above). "
            "Use the spec that trained it, or train a new checkpoint."
        )
    size = {k: getattr(spec.model, k) for k in ("d_model", "layers", "heads")}
    saved = {k: asdict(config)[k] for k in size}
    if size != saved:
        raise UserError(
            f"{what} has model size {saved} but the spec asks for {size}; set model.* to match the checkpoint."
        )


@dataclass
class LoadedCheckpoint:
    """A run checkpoint as the plan holds it (or an ONNX bundle standing in for one:
    tasks/run/backend_setup.py), for the chain's starting weights and the run record."""

    model: dict[str, torch.Tensor] | None  # state dict; None: ONNX Runtime serves a bundle
    schema: ModelSchema
    encoding: Encoding
    optimizer: dict[str, Any] | None  # train+predict: the state a resumed run continues from
    temperature: float  # output calibration (tasks/stages/calibrate.py)
    load: CheckpointLoad | None  # what loading the file cost; None for a bundle


def load_run_checkpoint(path: Path, spec: Spec) -> LoadedCheckpoint:
    """The checkpoint's weights (expanded to fp32 whatever the file's format), schema,
    encoding, calibration temperature and (train+predict: resume) optimizer state, plus what
    loading cost: file bytes, seconds, host RSS after the load."""
    if not path.is_file():
        raise UserError(
            f"run.checkpoint '{path}' does not exist; pass the .ckpt file a train+predict run "
            "wrote (its path is printed and logged as the run's 'checkpoint' artifact)."
        )
    try:
        with Clock().measure() as span:
            ckpt = load_checkpoint(path)
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same user problem
        raise UserError(
            f"run.checkpoint '{path}' cannot be loaded: {load_error_reason(path, err)}. Pass a .ckpt "
            "file a train+predict run (or relflow-bench quantize) wrote."
        ) from None
    rss = psutil.Process().memory_info().rss
    check_matches_spec(ckpt.model.schema, ckpt.model.config, spec, f"run.checkpoint '{path}'")
    check_split(ckpt.extra.get("split"), spec, f"run.checkpoint '{path}'")
    state = ckpt.model.state_dict()
    out = LoadedCheckpoint(
        model=state,
        schema=ckpt.model.schema,
        encoding=Encoding.from_dict(ckpt.extra["encoding"]),
        optimizer=None,
        # Output calibration (tasks/stages/calibrate.py); checkpoints from before it had none.
        temperature=float(ckpt.extra.get("temperature", 1.0)),
        load=CheckpointLoad(
            path=str(path),
            weights_format=ckpt.weights_format,
            bytes=path.stat().st_size,
            load_seconds=span.seconds,
            host_after_load_bytes=rss,
            model_bytes_after_load=sum(t.numel() * t.element_size() for t in state.values()),
            model_bytes_fp32=sum(
                t.numel() * (4 if t.is_floating_point() else t.element_size()) for t in state.values()
            ),
            source_sha256=ckpt.source_sha256,
            quantized=ckpt.quantized_weights,
        ),
    )
    if spec.run.mode == "train+predict":
        out.optimizer = _resumable_optimizer(path, ckpt, spec)
    return out


def _resumable_optimizer(path: Path, ckpt: Any, spec: Spec) -> dict[str, Any]:
    """The saved optimizer state, after checking the spec keeps the saved settings."""
    if ckpt.optimizer_state is None or ckpt.optimizer_settings is None:
        raise UserError(
            f"run.checkpoint '{path}' has no optimizer state, so training cannot resume from it; "
            "use --set run.mode=predict to only predict with it, or drop run.checkpoint."
        )
    want = optimizer_settings(spec).settings()
    saved = ckpt.optimizer_settings
    diff = {k: (saved.get(k), want.get(k)) for k in sorted(set(want) | set(saved)) if saved.get(k) != want.get(k)}
    if diff:
        names = {
            "learning_rate": "run.learning_rate",
            "weight_decay": "run.adamw.weight_decay",
            "fused": "run.adamw.fused",
        }
        detail = ", ".join(f"{names.get(k, k)}: saved {a!r}, spec {b!r}" for k, (a, b) in diff.items())
        raise UserError(
            f"run.checkpoint '{path}' was trained with other optimizer settings ({detail}); "
            "resume with the saved settings (set those keys to the saved values) or start a "
            "new run without run.checkpoint."
        )
    state: dict[str, Any] = ckpt.optimizer_state
    return state
