"""What the served model really holds and did: its tensors' resident bytes, and the calls of
its native fp8 Linears that fell back to the dequantized weight.

``memory.model_bytes_after_load`` was the byte count of the checkpoint's state expanded to
fp32, so it equalled ``memory.model_bytes_fp32`` by construction, even when the backend then
kept fp8 codes (``Fp8Linear``). It is now read from the model the run serves, once the
backend has set it up: every distinct storage behind its weights (parameters and persistent
buffers: its ``state_dict``; non-persistent buffers are index tables and run counters) at its
stored dtype (a view such as ``Fp8Linear.weight_fp8_t``, the transpose of the stored codes,
shares its storage and counts once). Portable PyTorch expands int8/int4/fp16 checkpoints to
fp32 at load, so for them the figure still equals the fp32 one: that is what the process
holds. Tensors a backend keeps beside the model (Triton's packed Linears) are its own figure,
``backend.model_bytes``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from model.quantize import fp8_fallback_calls
from tasks.measure import keys as K


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``, each counted once at its full size."""
    sizes: dict[tuple[str, int], int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        key = (str(storage.device), storage.data_ptr())
        sizes[key] = max(sizes.get(key, 0), storage.nbytes())
    return sum(sizes.values())


def model_bytes(model: torch.nn.Module) -> int:
    """Resident bytes of the model's weights as stored (fp8 codes at 1 byte each)."""
    return storage_bytes(model.state_dict().values())


def fp8_metrics(model: torch.nn.Module) -> dict[str, float]:
    """``backend.fp8_fallback_calls`` for a model serving native fp8 weights; empty otherwise."""
    calls = fp8_fallback_calls(model)
    return {} if calls is None else {K.BACKEND_FP8_FALLBACK_CALLS: float(calls)}
