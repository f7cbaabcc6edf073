"""Run checkpoints: the model package's checkpoint plus the harness's fitted encoding.

``train+predict`` saves one next to the predictions (and logs it to MLflow); ``predict``
with ``run.checkpoint`` loads it. A checkpoint whose schema or model size does not match
the spec is refused up front with the difference named.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from model.arrow import Encoding
from model.checkpoint import load_checkpoint, save_checkpoint
from model.schema import ModelSchema, NodeDef
from tasks.clock import Clock
from tasks.errors import UserError
from tasks.records import CheckpointLoad
from tasks.spec import Spec
from tasks.tensorize import layout


def _shape(node: NodeDef) -> list[Any]:
    return [node.name, [c.name for c in node.columns], node.max_length, node.reduce,
            [_shape(c) for c in node.children]]


def save_run_checkpoint(path: Path, engine: Any, enc: Encoding, spec: Spec) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        save_checkpoint(tmp, engine.model, optimizer=engine.optimizer,
                        optimizer_settings=engine.optimizer_settings,
                        extra={"encoding": enc.to_dict(), "spec_hash": spec.spec_hash})
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def check_matches_spec(model: Any, spec: Spec, what: str) -> None:
    """Refuse a model whose schema or size differs from the spec's, naming the difference."""
    schema: ModelSchema = model.schema
    lay = layout(spec)

    def spec_shape(n) -> list[Any]:
        return [n.name, list(n.columns), n.max_length, n.reduce, [spec_shape(c) for c in n.children]]

    want = spec_shape(lay)
    have = _shape(schema.root)
    have[2], have[3] = want[2], want[3]  # the root's length and reduce carry no meaning
    if have != want or schema.target.column != spec.task.target:
        raise UserError(
            f"{what} was trained on a different schema: checkpoint {have} vs "
            f"spec {want}. Use the spec that trained it, or train a new checkpoint."
        )
    size = {k: getattr(spec.model, k) for k in ("d_model", "layers", "heads")}
    saved = {k: asdict(model.config)[k] for k in size}
    if size != saved:
        raise UserError(
            f"{what} has model size {saved} but the spec asks for {size}; "
            "set model.* to match the checkpoint."
        )


def load_run_checkpoint(path: Path, spec: Spec) -> dict[str, Any]:
    """The checkpoint's weights (expanded to fp32 whatever the file's format), schema and
    encoding, plus what loading cost: file bytes, seconds, host RSS after the load."""
    if not path.is_file():
        raise UserError(
            f"run.checkpoint '{path}' does not exist; pass the .ckpt file a train+predict run "
            "wrote (its path is printed and logged as the run's 'checkpoint' artifact)."
        )
    try:
        with Clock().measure() as span:
            ckpt = load_checkpoint(path)
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same user problem
        raise UserError(f"run.checkpoint '{path}' cannot be loaded: {err}") from None
    rss = psutil.Process().memory_info().rss
    check_matches_spec(ckpt.model, spec, f"run.checkpoint '{path}'")
    state = ckpt.model.state_dict()
    return {"model": state, "schema": ckpt.model.schema,
            "encoding": Encoding.from_dict(ckpt.extra["encoding"]),
            "load": CheckpointLoad(
                path=str(path), weights_format=ckpt.weights_format, bytes=path.stat().st_size,
                load_seconds=span.seconds, host_after_load_bytes=rss,
                model_bytes_after_load=sum(t.numel() * t.element_size() for t in state.values()),
                model_bytes_fp32=sum(t.numel() * 4 for t in state.values() if t.is_floating_point())
                + sum(t.numel() * t.element_size() for t in state.values() if not t.is_floating_point()),
                source_sha256=ckpt.source_sha256, quantized=ckpt.quantized_weights)}
