"""Export bundles: one exported ONNX model, versioned beside the config that produced it.

    <out>/<spec name>-<content hash>/
        model.onnx       the padded forward, dynamic batch and per-branch length axes
        config.json      model config, model schema, fitted encoding, calibration
                         temperature, outputs, signature
        spec.yaml        the validated spec
        manifest.json    content hash, spec hash, checkpoint sha256 and weight format,
                         opset, torch / onnx / onnxscript versions, export seconds, bytes

The content hash covers ``model.onnx``, ``config.json`` and ``spec.yaml``; exports of two
different checkpoints land in two folders, and an identical re-export reuses the folder.
The folder is written under a temporary name and renamed, so a failed export leaves nothing.
Derived files (ONNX Runtime's dynamic int8 model) are added beside ``model.onnx`` later,
each named for how it was derived.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from model.checkpoint import file_sha256, load_checkpoint, schema_from_dict, schema_to_dict
from model.schema import ModelSchema
from tasks.measure.clock import Clock
from tasks.runtime.errors import UserError
from tasks.spec import Spec, load_yaml, parse_spec
from tasks.stages.split import check_split

MODEL_FILE = "model.onnx"
DYNAMIC_INT8_FILE = "model.dynamic_int8.onnx"
MAX_BUNDLE_JSON_BYTES = 1_000_000  # manifest.json and config.json: a few KB when written by export


def _read_json(path: Path) -> dict[str, Any]:
    """A bundle's JSON file as a mapping, bounded; a damaged or foreign file is a ``UserError``
    (it raised a bare ``JSONDecodeError``, exit 1, and a huge one was read whole)."""
    again = "export the checkpoint again."
    size = path.stat().st_size
    if size > MAX_BUNDLE_JSON_BYTES:
        raise UserError(
            f"export bundle file '{path}' is {size:,} bytes, over the {MAX_BUNDLE_JSON_BYTES:,}-byte limit "
            f"(MAX_BUNDLE_JSON_BYTES); it was not written by export: {again}"
        )
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UserError(f"export bundle file '{path}' is not valid JSON ({err}); {again}") from None
    if not isinstance(data, dict):
        raise UserError(f"export bundle file '{path}' must hold a JSON object; {again}")
    return data


def temp_prefix(name: str) -> str:
    """The temporary bundle folder's name start: per process, so an interrupted export removes its own only."""
    return f".{name}-export-{os.getpid()}-"


def _version(pkg: str) -> str:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return "absent"


@dataclass(frozen=True)
class Bundle:
    path: Path
    manifest: dict[str, Any]
    config: dict[str, Any]

    @property
    def content_hash(self) -> str:
        return str(self.manifest["bundle_hash"])

    @property
    def model_file(self) -> Path:
        return self.path / MODEL_FILE

    @property
    def schema(self) -> ModelSchema:
        return schema_from_dict(self.config["schema"])

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(self.config["signature"]["outputs"])

    def spec(self) -> Spec:
        where = f"'{self.path / 'spec.yaml'}'"
        return parse_spec(load_yaml((self.path / "spec.yaml").read_text(), where), where)


def _opset(path: Path) -> int:
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    return next(int(o.version) for o in m.opset_import if o.domain in ("", "ai.onnx"))


def export_bundle(
    checkpoint: Path, spec: Spec, outputs: tuple[str, ...], out_dir: Path, clock: Clock | None = None
) -> Bundle:
    """Export ``checkpoint`` (any weight format; expanded to fp32) to a bundle in ``out_dir``."""
    from model.export import export_onnx

    clock = clock or Clock()
    if not checkpoint.is_file():
        raise UserError(f"checkpoint '{checkpoint}' does not exist; pass the .ckpt a train+predict run wrote.")
    try:
        ckpt = load_checkpoint(checkpoint)
    except Exception as err:  # noqa: BLE001 - an unreadable file is one user problem
        from tasks.backends.checkpoint import load_error_reason

        raise UserError(f"checkpoint '{checkpoint}' cannot be loaded: {load_error_reason(checkpoint, err)}.") from None
    from tasks.backends.checkpoint import check_matches_spec

    check_matches_spec(ckpt.model.schema, ckpt.model.config, spec, f"checkpoint '{checkpoint}'")
    # a bundle without a matching split record could never be served (tasks/run/backend_setup.py)
    check_split(ckpt.extra.get("split"), spec, f"checkpoint '{checkpoint}'")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(spec.name), dir=out_dir))
    try:
        with clock.measure() as span:
            sig = export_onnx(ckpt.model, outputs, tmp / MODEL_FILE)
        config = {
            "model_config": ckpt.model.config.to_dict(),
            "schema": schema_to_dict(ckpt.model.schema),
            "encoding": ckpt.extra.get("encoding"),
            # Output calibration fitted with the checkpoint (tasks/stages/calibrate.py; 1.0 = none).
            "temperature": float(ckpt.extra.get("temperature", 1.0)),
            # the checkpoint's train/held-out split (tasks/stages/split.py), checked at serving
            "split": ckpt.extra.get("split"),
            "outputs": list(sig.outputs),
            "signature": sig.to_dict(),
        }
        (tmp / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
        (tmp / "spec.yaml").write_text(spec.to_yaml())
        digest = hashlib.sha256()
        for name in (MODEL_FILE, "config.json", "spec.yaml"):
            digest.update(name.encode())
            digest.update(file_sha256(tmp / name).encode())
        content = digest.hexdigest()
        manifest = {
            "bundle_hash": content,
            "spec_name": spec.name,
            "spec_hash": spec.spec_hash,
            "checkpoint_sha256": file_sha256(checkpoint),
            "checkpoint_path": str(checkpoint.resolve()),
            "checkpoint_weights_format": ckpt.weights_format,
            "checkpoint_source_sha256": ckpt.source_sha256,
            "opset": _opset(tmp / MODEL_FILE),
            "torch_version": torch.__version__,
            "onnx_version": _version("onnx"),
            "onnxscript_version": _version("onnxscript"),
            "exporter": "torch.onnx.export(dynamo=True)",
            "export_seconds": span.seconds,
            "model_bytes": (tmp / MODEL_FILE).stat().st_size,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
        final = out_dir / f"{spec.name}-{content[:16]}"
        if final.exists():  # the same content exported before: keep the first copy
            shutil.rmtree(tmp)
            return read_bundle(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Bundle(final, manifest, config)


def read_bundle(path: Path) -> Bundle:
    """A bundle folder, checked: every file present and the content hash matching."""
    missing = [n for n in (MODEL_FILE, "config.json", "spec.yaml", "manifest.json") if not (path / n).is_file()]
    if not path.is_dir() or missing:
        raise UserError(
            f"run.onnxruntime.model '{path}' is not an export bundle (missing {missing or 'the folder'}); "
            "pass a folder written by 'relflow-bench export SPEC --checkpoint CKPT'."
        )
    manifest = _read_json(path / "manifest.json")
    digest = hashlib.sha256()
    for name in (MODEL_FILE, "config.json", "spec.yaml"):
        digest.update(name.encode())
        digest.update(file_sha256(path / name).encode())
    if digest.hexdigest() != manifest.get("bundle_hash"):
        raise UserError(
            f"export bundle '{path}' does not match its manifest's content hash (a file was changed "
            "after export); export the checkpoint again."
        )
    return Bundle(path, manifest, _read_json(path / "config.json"))
