"""The ONNX Runtime backend: an export bundle's model in an ``InferenceSession``.

Providers are chosen at load time (``run.onnxruntime.providers``), so one bundle serves CPU
and GPU hosts; a provider this onnxruntime build lacks is a ``UserError`` naming the ones it
has, raised by ``check_providers`` before any work. ``step`` feeds the batch's tensors as
NumPy arrays (zero-copy views of CPU tensors) and returns torch tensors, so conversions are
inside the timed step just as PyTorch's device-to-host copy is.

ONNX Runtime's own dynamic int8 quantization (``run.onnxruntime.quantization:
dynamic_int8``) is derived once from ``model.onnx`` into the bundle folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from model.batch import Batch
from model.export import output_name
from tasks.backends.bundle import DYNAMIC_INT8_FILE, Bundle
from tasks.measure.clock import Clock
from tasks.runtime.errors import UserError
from tasks.spec import OnnxRuntime

LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


def version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)


def check_providers(settings: OnnxRuntime) -> None:
    import onnxruntime

    available = onnxruntime.get_available_providers()
    missing = [p for p in settings.providers if p not in available]
    if missing:
        raise UserError(
            f"run.onnxruntime.providers {missing} not available in this onnxruntime "
            f"{onnxruntime.__version__} build; available here: {available}. Choose from those "
            "(e.g. [CPUExecutionProvider]) or install the onnxruntime build that has it."
        )


def dynamic_int8(bundle: Bundle, clock: Clock) -> tuple[Path, float | None]:
    """The bundle's model quantized by ONNX Runtime (dynamic int8 weights), made once."""
    target = bundle.path / DYNAMIC_INT8_FILE
    if target.is_file():
        return target, None
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = target.with_name(f".{target.name}.tmp")
    with clock.measure() as span:
        quantize_dynamic(str(bundle.model_file), str(tmp), weight_type=QuantType.QInt8)
    tmp.replace(target)
    return target, span.seconds


def intra_op_threads(settings: OnnxRuntime) -> int:
    """The intra-op threads a session is created with: the setting, or (0) torch's intra-op
    thread count at that moment (the process's: the backend is set up before a request
    scenario switches torch to ``run.request.intra_op_threads``)."""
    return settings.intra_op_threads or torch.get_num_threads()


def session_threads(session: Any, asked: int) -> int:
    """The intra-op threads ``session`` (an ``InferenceSession``) has, as its options say;
    ``asked`` where they say 0 (ONNX Runtime's own default, never what the harness asks)."""
    return int(session.get_session_options().intra_op_num_threads) or asked


class OnnxRuntimeBackend:
    name = "onnxruntime"

    def __init__(self, bundle: Bundle, model_file: Path, settings: OnnxRuntime) -> None:
        import onnxruntime

        check_providers(settings)
        opts = onnxruntime.SessionOptions()
        # Like for like with PyTorch: 0 means torch's own intra-op thread count (the run's
        # run.threads), not ONNX Runtime's default of one per core, which differs under a
        # thread cap and made the backends report compare two thread counts.
        asked = intra_op_threads(settings)
        opts.intra_op_num_threads = asked
        opts.inter_op_num_threads = settings.inter_op_threads
        opts.graph_optimization_level = getattr(
            onnxruntime.GraphOptimizationLevel, LEVELS[settings.graph_optimization_level]
        )
        self.bundle, self.model_file, self.settings = bundle, model_file, settings
        self.session = onnxruntime.InferenceSession(
            str(model_file), sess_options=opts, providers=list(settings.providers)
        )
        # fixed now, whatever torch's count is when the session runs (session_threads)
        self.intra_op_threads = session_threads(self.session, asked)
        sig = bundle.config["signature"]
        self.nodes = sig["nodes"]
        self.outputs = tuple(sig["outputs"])
        self.input_names = [i.name for i in self.session.get_inputs()]

    def encoder_path(self) -> str:
        return "padded"

    def step(self, batch: Batch, outputs: tuple[str, ...]) -> dict[str, torch.Tensor]:
        missing = [o for o in outputs if o not in self.outputs]
        if missing:
            raise UserError(
                f"export bundle '{self.bundle.path}' has outputs {list(self.outputs)}, "
                f"not {missing}; export again with the spec's task.outputs."
            )
        feeds = {}
        for name in self.input_names:  # "<node>.<field>", the exported signature's inputs
            node, f = name.rsplit(".", 1)
            feeds[name] = getattr(batch.nodes[node], f).detach().cpu().numpy()
        names = [output_name(o) for o in outputs]
        values = self.session.run(names, feeds)
        return {o: torch.from_numpy(v) for o, v in zip(outputs, values, strict=True)}

    def session_threads(self) -> int | None:
        """The session's own intra-op threads: what its predict compute ran at, not torch's."""
        return self.intra_op_threads

    def tags(self) -> dict[str, str]:
        m = self.bundle.manifest
        return {
            "relflow.backend": self.name,
            "relflow.providers": ",".join(self.session.get_providers()),
            "relflow.onnxruntime_version": version(),
            "relflow.bundle_hash": m["bundle_hash"],
            "relflow.bundle_path": str(self.bundle.path),
            "relflow.onnx_model_file": self.model_file.name,
            "relflow.onnxruntime.quantization": self.settings.quantization or "none",
            "relflow.onnxruntime.intra_op_threads": str(self.intra_op_threads),
            "relflow.weights_format": (
                "dynamic_int8" if self.settings.quantization else m.get("checkpoint_weights_format", "fp32")
            ),
            "relflow.opset": str(m["opset"]),
        }
