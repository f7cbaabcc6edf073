"""Quantized weight formats for checkpoints: fp16, int8, int4 and fp8 (e4m3).

A quantized checkpoint stores ``weights = {"format", "source_sha256", "group_size",
"tensors"}`` instead of the fp32 ``state_dict``; ``expand_state`` turns it back into an
fp32 ``state_dict`` while loading (portable PyTorch computes in full precision, so these
formats save disk and load time, not runtime memory).

Formats, per floating tensor with two or more dims (Linear weights, embedding tables, the
coordinate encoders' per-column tables); 1-D tensors (biases, norms, learned vectors) stay
fp32 in the integer and fp8 formats, and become fp16 in the fp16 format:

- ``fp16``: every floating tensor cast to float16.
- ``int8``: symmetric per-channel (per row of dim 0): ``scale = max|w| / 127``,
  ``q = round(w / scale)`` in [-127, 127]; scales fp32.
- ``int4``: symmetric per group of ``group_size`` consecutive values along each row
  (rows padded with zeros to a whole number of groups): ``scale = max|w| / 7``,
  ``q = round(w / scale)`` in [-8, 7], stored as ``q + 8`` in 4 bits, two per byte (the
  even element in the low nibble, the odd one in the high nibble); scales fp16.
- ``fp8``: ``float8_e4m3fn`` per-channel scaled: ``scale = max|w| / 448`` (the largest
  finite e4m3 value), ``q = (w / scale).to(float8_e4m3fn)``; scales fp32.

An all-zero row gets scale 1 so it round-trips exactly. Imports torch only.
"""

from __future__ import annotations

from typing import Any

import torch

FORMATS = ("fp16", "int8", "int4", "fp8")
INT4_GROUP_SIZE = 32
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


def _rows(w: torch.Tensor) -> torch.Tensor:
    return w.detach().float().reshape(w.shape[0], -1)


def _scale(amax: torch.Tensor, top: float) -> torch.Tensor:
    return torch.where(amax > 0, amax / top, torch.ones_like(amax))


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int values in [-8, 7], last dim even -> uint8 with two values per byte."""
    if q.shape[-1] % 2:
        raise ValueError(f"pack_int4 needs an even last dimension, got {tuple(q.shape)}")
    u = (q.to(torch.int16) + 8).to(torch.uint8)
    return u[..., 0::2] | (u[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 -> int8 values in [-8, 7]; the last dim doubles."""
    lo = (packed & 0x0F).to(torch.int8) - 8
    hi = (packed >> 4).to(torch.int8) - 8
    return torch.stack([lo, hi], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def quantize_tensor(w: torch.Tensor, fmt: str, group_size: int = INT4_GROUP_SIZE) -> dict[str, Any]:
    """One tensor in ``fmt``: a dict of plain tensors and ints (``weights_only`` loadable)."""
    if not w.is_floating_point():
        return {"kind": "raw", "data": w}
    if fmt == "fp16":
        return {"kind": "fp16", "data": w.detach().to(torch.float16)}
    if w.dim() < 2:
        return {"kind": "raw", "data": w.detach().float()}
    shape = list(w.shape)
    rows = _rows(w)
    if fmt == "int8":
        scale = _scale(rows.abs().amax(dim=1), 127.0)
        q = torch.round(rows / scale[:, None]).clamp(-127, 127).to(torch.int8)
        return {"kind": "int8", "shape": shape, "q": q, "scale": scale}
    if fmt == "int4":
        n = rows.shape[1]
        groups = -(-n // group_size)
        padded = torch.zeros(rows.shape[0], groups * group_size)
        padded[:, :n] = rows
        grouped = padded.view(rows.shape[0], groups, group_size)
        scale = _scale(grouped.abs().amax(dim=2), 7.0).to(torch.float16)
        q = torch.round(grouped / scale.float()[..., None]).clamp(-8, 7)
        return {
            "kind": "int4",
            "shape": shape,
            "packed": pack_int4(q.reshape(rows.shape[0], -1)),
            "scale": scale,
            "group_size": group_size,
        }
    if fmt == "fp8":
        scale = _scale(rows.abs().amax(dim=1), FP8_MAX)
        q = (rows / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return {"kind": "fp8", "shape": shape, "q": q, "scale": scale}
    raise ValueError(f"unknown weight format {fmt!r}; choose one of {FORMATS}")


def dequantize_tensor(entry: dict[str, Any]) -> torch.Tensor:
    """The fp32 tensor back (``raw`` entries keep their dtype: integer buffers stay integer)."""
    kind = entry["kind"]
    if kind == "raw":
        raw: torch.Tensor = entry["data"]
        return raw
    if kind == "fp16":
        half: torch.Tensor = entry["data"]
        return half.float()
    shape: list[int] = entry["shape"]
    if kind in ("int8", "fp8"):
        q8: torch.Tensor = entry["q"]
        scale: torch.Tensor = entry["scale"]
        return (q8.float() * scale[:, None]).reshape(shape)
    if kind == "int4":
        rows, n = shape[0], 1
        for d in shape[1:]:
            n *= d
        g = int(entry["group_size"])
        q = unpack_int4(entry["packed"]).float().view(rows, -1, g)
        group_scale: torch.Tensor = entry["scale"]
        return (q * group_scale.float()[..., None]).reshape(rows, -1)[:, :n].reshape(shape)
    raise ValueError(f"unknown quantized tensor kind {kind!r}")


def quantize_state(
    state: dict[str, torch.Tensor], fmt: str, source_sha256: str, group_size: int = INT4_GROUP_SIZE
) -> dict[str, Any]:
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}; choose one of {FORMATS}")
    return {
        "format": fmt,
        "source_sha256": source_sha256,
        "group_size": group_size,
        "tensors": {k: quantize_tensor(v, fmt, group_size) for k, v in state.items()},
    }


def expand_state(weights: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A quantized ``weights`` payload -> an fp32 ``state_dict`` (expanded at load)."""
    return {k: dequantize_tensor(e) for k, e in weights["tensors"].items()}


def fp8_native_supported(device: torch.device) -> bool:
    """Scaled fp8 matmul (``torch._scaled_mm``) needs CUDA compute capability 8.9+."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9) and hasattr(torch, "_scaled_mm")


class Fp8Linear(torch.nn.Module):
    """A Linear whose weight stays fp8 e4m3 (per-output-channel scales) on supported CUDA:
    activations are scaled per row to e4m3 and multiplied with ``torch._scaled_mm``
    (row-wise scales, bf16 out, then cast back). Shapes the kernel refuses (dims not
    multiples of 16) fall back to the dequantized weight for that call, and ``fallback_calls``
    counts those calls: a run whose weights are tagged native must not have computed from the
    expanded weight behind the tag (under packing most calls' row counts are not multiples of
    16). The count is a tensor buffer, bumped in place, so compiled regions neither guard on
    it nor recompile as it changes, and reading it is the caller's one sync."""

    weight_fp8_t: torch.Tensor
    scale_1N: torch.Tensor
    fallback_calls: torch.Tensor

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = q.shape[1], q.shape[0]
        self.register_buffer("weight_fp8_t", q.t())  # column-major [in, out] as _scaled_mm wants
        self.register_buffer("scale_1N", scale.float().view(1, -1))
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().clone(), requires_grad=False)
        # not persistent: run state, never part of a checkpoint
        self.register_buffer("fallback_calls", torch.zeros((), dtype=torch.int64, device=q.device), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        if x2.shape[0] % 16 or self.in_features % 16 or self.out_features % 16:
            self.fallback_calls.add_(1)
            w = (self.weight_fp8_t.float() * self.scale_1N).t().to(x.dtype)
            return torch.nn.functional.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))
        amax = x2.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12)
        scale_M1 = amax / FP8_MAX
        x8 = (x2.float() / scale_M1).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(x8, self.weight_fp8_t, scale_a=scale_M1, scale_b=self.scale_1N, out_dtype=torch.bfloat16)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


def fp8_fallback_calls(model: torch.nn.Module) -> int | None:
    """Calls of the model's ``Fp8Linear`` modules that computed from the dequantized weight;
    None when it has none (its weights are not native fp8)."""
    counts = [m.fallback_calls for m in model.modules() if isinstance(m, Fp8Linear)]
    return int(torch.stack(counts).sum().item()) if counts else None  # one device sync


def use_native_fp8(model: torch.nn.Module, weights: dict[str, Any]) -> int:
    """Replace every ``nn.Linear`` whose weight was stored fp8 by an ``Fp8Linear`` over the
    stored bytes (CUDA 8.9+ only; see ``fp8_native_supported``). Returns how many."""
    tensors = weights["tensors"]
    swapped = 0
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear:
                continue
            full = next(n for n, m in model.named_modules() if m is child)
            entry = tensors.get(f"{full}.weight")
            if entry is None or entry["kind"] != "fp8":
                continue
            device = child.weight.device
            setattr(parent, child_name, Fp8Linear(entry["q"].to(device), entry["scale"].to(device), child.bias))
            swapped += 1
    return swapped
