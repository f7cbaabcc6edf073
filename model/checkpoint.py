"""Checkpoints: weights + everything needed to rebuild the model, loadable with
``torch.load(weights_only=True)``.

Design choices:
- The payload is plain data (dicts, lists, str, numbers, tensors): the schema and config
  as dicts, the model ``state_dict``, optionally the optimizer ``state_dict`` and its
  settings (``AdamW.settings()``), and ``extra`` (JSON-like harness state: vocabularies,
  standardisation statistics, step counters). No pickled classes, so ``weights_only=True``
  loading works and is always used.
- Compilation is runtime state and is never stored: a loaded model runs eager until
  ``compile`` is called again.
- Quantized checkpoints (``quantize_checkpoint``; formats in ``quantize.py``) carry
  ``weights`` instead of ``model`` and no optimizer state; loading expands them to fp32
  (``Checkpoint.weights_format`` says what the file held).
- Resuming refuses optimizer settings that differ from the saved run (``ValueError`` naming
  each differing setting), because silently changing them mid-run changes the experiment.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .config import ModelConfig
from .optim import AdamW
from .quantize import expand_state, quantize_state
from .schema import ColumnDef, ModelSchema, NodeDef, TargetDef
from .transformer import RelationalTransformer

FORMAT_VERSION = 1


def schema_to_dict(schema: ModelSchema) -> dict[str, Any]:
    def node(n: NodeDef) -> dict[str, Any]:
        return {
            "name": n.name,
            "columns": [asdict(c) for c in n.columns],
            "max_length": n.max_length,
            "reduce": n.reduce,
            "children": [node(c) for c in n.children],
        }

    return {"root": node(schema.root), "target": asdict(schema.target)}


def schema_from_dict(data: dict[str, Any]) -> ModelSchema:
    def node(d: dict[str, Any]) -> NodeDef:
        return NodeDef(
            name=d["name"],
            columns=tuple(ColumnDef(**c) for c in d["columns"]),
            max_length=d["max_length"],
            reduce=d["reduce"],
            children=tuple(node(c) for c in d["children"]),
        )

    return ModelSchema(root=node(data["root"]), target=TargetDef(**data["target"]))


def _settings_dict(settings: AdamW | dict[str, Any] | None) -> dict[str, Any] | None:
    if settings is None:
        return None
    return settings.settings() if isinstance(settings, AdamW) else dict(settings)


def save_checkpoint(
    path: str | Path,
    model: RelationalTransformer,
    optimizer: torch.optim.Optimizer | None = None,
    optimizer_settings: AdamW | dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write model (+ optimizer state and settings, + harness ``extra``) to ``path``.

    ``optimizer_settings`` defaults to ``model.optimizer`` when an optimizer is given."""
    if optimizer is not None and optimizer_settings is None:
        optimizer_settings = model.optimizer
    payload = {
        "format": FORMAT_VERSION,
        "schema": schema_to_dict(model.schema),
        "config": model.config.to_dict(),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "optimizer_settings": _settings_dict(optimizer_settings),
        "extra": extra or {},
    }
    torch.save(payload, Path(path))


@dataclass
class Checkpoint:
    model: RelationalTransformer
    optimizer_state: dict[str, Any] | None
    optimizer_settings: dict[str, Any] | None
    extra: dict[str, Any] = field(default_factory=dict)
    weights_format: str = "fp32"
    source_sha256: str | None = None  # quantized files: the fp32 checkpoint they came from
    quantized_weights: dict[str, Any] | None = None  # the payload as stored (fp8 native use)

    def resume_optimizer(self, settings: AdamW | dict[str, Any] | None = None) -> torch.optim.Optimizer:
        """Build the optimizer for ``self.model`` and restore its saved state.

        ``settings`` (default: ``self.model.optimizer``) must equal the saved settings."""
        if self.optimizer_state is None or self.optimizer_settings is None:
            raise ValueError(
                "this checkpoint has no optimizer state; save it with "
                "save_checkpoint(..., optimizer=opt) to resume training"
            )
        factory = settings if settings is not None else self.model.optimizer
        if isinstance(factory, dict):
            factory = AdamW(**{**factory, "betas": tuple(factory["betas"])})
        wanted = factory.settings()
        differ = {
            k: (self.optimizer_settings.get(k), wanted.get(k))
            for k in sorted(set(wanted) | set(self.optimizer_settings))
            if self.optimizer_settings.get(k) != wanted.get(k)
        }
        if differ:
            detail = ", ".join(f"{k}: saved {a!r} != requested {b!r}" for k, (a, b) in differ.items())
            raise ValueError(
                f"optimizer settings differ from the saved run ({detail}); resume with the "
                "saved settings (Checkpoint.optimizer_settings) or start a new run"
            )
        self.model.optimizer = factory
        optimizer = factory.build(self.model)
        optimizer.load_state_dict(self.optimizer_state)
        return optimizer


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Rebuild the model from ``path`` (eager: compilation is not stored)."""
    payload = torch.load(Path(path), map_location=map_location, weights_only=True)
    if payload.get("format") != FORMAT_VERSION:
        raise ValueError(
            f"{path}: checkpoint format {payload.get('format')!r} is not {FORMAT_VERSION}; "
            "re-save it with this version of the model package"
        )
    model = RelationalTransformer(schema_from_dict(payload["schema"]), ModelConfig(**payload["config"]))
    weights = payload.get("weights")
    model.load_state_dict(expand_state(weights) if weights is not None else payload["model"])
    model.to(map_location)
    settings = payload["optimizer_settings"]
    if settings is not None:
        model.optimizer = AdamW(**{**settings, "betas": tuple(settings["betas"])})
    if weights is None:
        return Checkpoint(model, payload["optimizer"], settings, payload["extra"])
    return Checkpoint(model, None, settings, payload["extra"], weights["format"], weights["source_sha256"], weights)


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def quantize_checkpoint(src: str | Path, dst: str | Path, fmt: str) -> dict[str, Any]:
    """Write ``src`` (an fp32 checkpoint) to ``dst`` in weight format ``fmt``.

    The optimizer state is dropped (a deployment file); the format and the source file's
    sha256 are recorded. Returns ``{"format", "source_sha256", "bytes"}``."""
    payload = torch.load(Path(src), map_location="cpu", weights_only=True)
    if payload.get("format") != FORMAT_VERSION:
        raise ValueError(f"{src}: checkpoint format {payload.get('format')!r} is not {FORMAT_VERSION}")
    if payload.get("weights") is not None:
        raise ValueError(
            f"{src} is already a {payload['weights']['format']} checkpoint; quantize the fp32 checkpoint it came from"
        )
    sha = file_sha256(src)
    out = {k: v for k, v in payload.items() if k not in ("model", "optimizer")}
    out["optimizer"] = None
    out["weights"] = quantize_state(payload["model"], fmt, sha)
    torch.save(out, Path(dst))
    return {"format": fmt, "source_sha256": sha, "bytes": Path(dst).stat().st_size}
