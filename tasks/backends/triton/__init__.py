"""The Triton serving backend (``run.backend: triton``): packed attention and packed-weight
linears in this project's Triton kernels (``kernels.py``), served by ``TritonBackend``
(``backend.py``). This module imports neither triton nor the kernels, so the settings check
runs anywhere; see ``check_available``."""

from __future__ import annotations

import importlib.util
import os

# torch 2.13.0's CUDA wheels require exactly this triton (their Requires-Dist); pyproject pins it.
TRITON_VERSION = "3.7.1"
# checkpoint weight format -> how the backend keeps the Linears (int4 has no kernel here)
KEPT = {"fp32": "fp32", "fp16": "fp16", "int8": "int8", "fp8": "fp8"}


def check_format(weights_format: str) -> None:
    if weights_format not in KEPT:
        raise ValueError(
            f"run.backend triton serves {list(KEPT)} weights, not {weights_format!r}; use the "
            "checkpoint's fp8 or int8 version (relflow-bench quantize), or run.backend pytorch"
        )


def interpret_requested() -> bool:
    """``TRITON_INTERPRET=1``: kernels run on CPU tensors in Triton's interpreter (tests)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def missing_requirement(device_type: str, cuda_available: bool) -> str | None:
    """What ``run.backend: triton`` lacks on this host (None: nothing)."""
    if importlib.util.find_spec("triton") is None:
        return f"the triton package is not installed: pip install triton=={TRITON_VERSION} (pip install -e . does it)"
    if interpret_requested():
        return None
    if device_type != "cuda" or not cuda_available:
        where = "no CUDA device is available" if not cuda_available else f"run.device resolves to {device_type!r}"
        return (
            f"run.backend triton needs a CUDA device ({where}); use run.backend pytorch here, or set "
            "TRITON_INTERPRET=1 to run the kernels in Triton's CPU interpreter (correctness only, slow)"
        )
    return None
