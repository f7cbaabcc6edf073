"""Choosing and starting the serving backend for a run.

``check_backend`` runs in ``plan()`` (before any work or MLflow run): provider availability,
the bundle's integrity, schema, outputs and checkpoint. ``start_backend`` runs after
training and before the first predict pass, outside every timed stage: it exports the
run's checkpoint when no bundle was given, derives ONNX Runtime's int8 model when asked,
creates the session, and for PyTorch decides whether fp8 weights stay native.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from model.arrow import Encoding
from model.checkpoint import file_sha256
from model.config import ModelConfig
from model.quantize import fp8_native_supported
from tasks.backends import Backend
from tasks.backends.bundle import Bundle, export_bundle, read_bundle
from tasks.backends.checkpoint import LoadedCheckpoint
from tasks.backends.pytorch import PyTorchBackend
from tasks.backends.served import model_bytes
from tasks.libraries.reference.engine import Engine
from tasks.measure.clock import Clock, wall_clock
from tasks.measure.records import BackendSetup, CheckpointLoad
from tasks.run.chain import Chain
from tasks.runtime import progress
from tasks.runtime.errors import UserError
from tasks.spec import Spec
from tasks.stages.split import check_split


@dataclass
class BackendPlan:
    bundle: Bundle | None = None


def needed_outputs(spec: Spec) -> tuple[str, ...]:
    return Engine.needed_outputs(tuple(spec.task.outputs))


def check_backend_settings(spec: Spec) -> None:
    """The backend's own settings (providers present in this build): cheap, so before the data
    is scanned."""
    if spec.run.backend == "onnxruntime":
        from tasks.backends.onnxruntime import check_providers

        check_providers(spec.run.onnxruntime)
    elif spec.run.backend == "triton":
        import torch

        from tasks.backends.triton import missing_requirement
        from tasks.stages.compute import resolve_device

        need = missing_requirement(resolve_device(spec).type, torch.cuda.is_available())
        if need:
            raise UserError(need)


def check_backend(spec: Spec, checkpoint: LoadedCheckpoint | None) -> tuple[BackendPlan, LoadedCheckpoint | None]:
    """Checks before any work; returns the plan and the checkpoint-like inputs (a bundle
    given as ``run.onnxruntime.model`` supplies the schema and the fitted encoding)."""
    r = spec.run
    if r.backend == "triton" and r.mode == "predict" and checkpoint is not None and checkpoint.load is not None:
        from tasks.backends.triton import check_format

        try:
            check_format(checkpoint.load.weights_format)
        except ValueError as err:
            raise UserError(f"run.checkpoint: {err}") from None
    if r.backend != "onnxruntime":
        return BackendPlan(), checkpoint
    from tasks.backends.checkpoint import check_matches_spec
    from tasks.backends.onnxruntime import check_providers

    check_providers(r.onnxruntime)
    if not r.onnxruntime.model:
        if r.mode == "predict" and not r.checkpoint:
            raise UserError(
                "run.backend onnxruntime in predict mode needs weights to export: set "
                "run.checkpoint (the run exports it first) or run.onnxruntime.model (a bundle)."
            )
        return BackendPlan(), checkpoint
    bundle = read_bundle(Path(r.onnxruntime.model))
    where = f"run.onnxruntime.model '{bundle.path}'"
    check_matches_spec(bundle.schema, ModelConfig(**bundle.config["model_config"]), spec, where)
    check_split(bundle.config.get("split"), spec, where)
    missing = [o for o in needed_outputs(spec) if o not in bundle.outputs]
    if missing:
        raise UserError(
            f"{where} was exported with outputs {list(bundle.outputs)}, the spec needs {missing}; "
            "export again with this spec's task.outputs."
        )
    if r.checkpoint and file_sha256(r.checkpoint) != bundle.manifest["checkpoint_sha256"]:
        raise UserError(
            f"{where} was exported from another checkpoint than run.checkpoint "
            f"'{r.checkpoint}'; drop one of the two or export that checkpoint."
        )
    if checkpoint is None:
        checkpoint = LoadedCheckpoint(
            model=None,  # ONNX Runtime serves the bundle; the engine's own model stays unused
            schema=bundle.schema,
            encoding=Encoding.from_dict(bundle.config["encoding"]),
            optimizer=None,
            temperature=float(bundle.config.get("temperature", 1.0)),
            load=None,
        )
    return BackendPlan(bundle), checkpoint


def start_backend(
    spec: Spec,
    engine: Engine,
    plan: BackendPlan,
    checkpoint_path: Path | None,
    load: CheckpointLoad | None,
    clock: Clock,
) -> tuple[BackendSetup, dict[str, str]]:
    """The backend the run's predict passes serve through, handed to the engine; returns its
    set-up costs and tags."""
    backend, setup = _start(spec, engine, plan, checkpoint_path, load, clock)
    if load is not None:  # what the served model holds (native fp8 codes at 1 byte), not the expanded state
        load.model_bytes_after_load = model_bytes(engine.model)
    engine.serve_with(backend)
    return setup, backend.tags()


def _start(
    spec: Spec,
    engine: Engine,
    plan: BackendPlan,
    checkpoint_path: Path | None,
    load: CheckpointLoad | None,
    clock: Clock,
) -> tuple[Backend, BackendSetup]:
    setup = BackendSetup()
    r = spec.run
    if r.backend == "pytorch":
        fmt = load.weights_format if load else "fp32"
        native = fmt == "fp32"  # every other format is expanded to fp32 at load, except native fp8
        if load is not None and load.quantized is not None and fmt == "fp8" and fp8_native_supported(engine.device):
            from model.quantize import use_native_fp8

            with clock.measure() as span:
                use_native_fp8(engine.model, load.quantized)
            setup.load_seconds = span.seconds
            native = True
        return PyTorchBackend(engine.model, engine.forward, engine.autocast, fmt, native), setup
    if r.backend == "triton":
        from tasks.backends.triton.backend import TritonBackend

        # predict serves the checkpoint's stored weights; after training, the trained fp32 ones
        stored = load if load is not None and r.mode == "predict" else None
        with clock.measure() as span:
            triton_backend = TritonBackend(
                engine.model,
                engine.device,
                stored.weights_format if stored else "fp32",
                stored.quantized if stored else None,
                r.precision,
            )
        setup.load_seconds = span.seconds
        setup.model_bytes = triton_backend.model_bytes  # the packed bytes it serves from, on the device
        return triton_backend, setup
    from tasks.backends.onnxruntime import OnnxRuntimeBackend, dynamic_int8

    bundle = plan.bundle
    if bundle is None:
        assert checkpoint_path is not None
        with clock.measure() as span:
            bundle = export_bundle(
                checkpoint_path, spec, needed_outputs(spec), Path(r.output_dir).resolve() / "bundles", clock
            )
        setup.export_seconds = span.seconds
        setup.export_bytes = bundle.model_file.stat().st_size
    model_file = bundle.model_file
    if r.onnxruntime.quantization == "dynamic_int8":
        model_file, setup.quantize_seconds = dynamic_int8(bundle, clock)
    with clock.measure() as span:
        backend = OnnxRuntimeBackend(bundle, model_file, r.onnxruntime)
    setup.load_seconds = span.seconds
    setup.model_bytes = model_file.stat().st_size
    return backend, setup


@dataclass
class Served:
    """What ``serving_backend`` set up: its seconds (outside e2e and orchestration), the
    checkpoint it saved (ONNX Runtime serves the run's own trained weights), costs and tags."""

    seconds: float = 0.0
    checkpoint: Path | None = None
    setup: BackendSetup | None = None
    tags: dict[str, str] | None = None


def serving_backend(
    spec: Spec, chain: Chain, plan: BackendPlan, load: CheckpointLoad | None, trained_checkpoint: Path
) -> Served:
    """Between training and the first predict pass: the backend the run serves with. ONNX
    Runtime after training exports the run's own checkpoint, saved to ``trained_checkpoint``
    first. A library under test other than the reference serves through its own engine (it
    refused every other backend before work)."""
    chain.ensure_engine()  # its own figure, harness.engine_setup_seconds
    start = wall_clock()
    engine = chain.side.reference_engine()
    if engine is None:  # untrained, unfitted yet; or a library's own
        return Served()
    served, saved = (Path(spec.run.checkpoint) if spec.run.checkpoint else None), None
    if spec.run.mode == "train+predict" and spec.run.backend == "onnxruntime":
        served = saved = trained_checkpoint  # ONNX Runtime serves the trained weights
        served.parent.mkdir(parents=True, exist_ok=True)  # the writer creates it only when committing
        engine.save_checkpoint(served, spec)
    progress.emit("phase", name=f"starting the {spec.run.backend} backend")
    setup, tags = start_backend(spec, engine, plan, served, load, chain.clock)
    return Served(wall_clock() - start, saved, setup, tags)
