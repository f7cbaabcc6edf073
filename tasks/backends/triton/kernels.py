"""Triton kernels of the Triton serving backend: packed attention and packed-weight linears.

- ``packed_attention``: forward self-attention over *packed present coordinates*. Tokens of
  every non-empty node instance lie back to back in one ``[N_tok, 3*D]`` q/k/v buffer (the
  ``qkv`` Linear's output, laid out as ``SelfAttention`` views it: ``[3, heads, D/heads]``),
  segment ``s`` spanning ``offsets[s]:offsets[s+1]``; no padding token exists anywhere. One
  program per (query block, segment, head) streams its segment's keys/values in blocks with
  an online (fused) softmax, so the ``[S, S]`` score matrix is never stored. Any head count
  and head width: the head dim is padded to a power of two >= 16 inside the kernel only.
- ``linear``: ``y = x @ W^T * scale + bias`` over weights kept in their stored format in
  device memory: fp8 e4m3 codes (uint8 storage) or int8, each with per-output-channel fp32
  scales, or plain fp16/fp32. The weight tile is decoded inside the kernel (e4m3 by integer
  bit arithmetic, so it runs on every CUDA arch and in the interpreter), multiplied in the
  compute dtype with fp32 accumulation, and the per-channel scale is applied once per output
  (it factors out of the sum over K). Nothing is expanded at load.

Compute dtype: fp32 (``tl.dot`` with ``input_precision="ieee"``, so results match PyTorch's
fp32 path instead of TF32's 10-bit mantissa), or fp16/bf16 (tensor-core dots, fp32
accumulation). Outputs are always fp32.

``TRITON_INTERPRET=1`` must be in the environment when this module is *imported*:
``triton.jit`` decides at decoration time whether a kernel is compiled or interpreted
(triton 3.7.1, ``runtime/jit.py``). ``interpreted()`` says which mode this import got.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

COMPUTE_DTYPES: dict[torch.dtype, Any] = {
    torch.float32: tl.float32,
    torch.float16: tl.float16,
    torch.bfloat16: tl.bfloat16,
}
WEIGHT_KINDS = ("fp32", "fp16", "int8", "fp8")
_KIND_CODE = {"fp32": 0, "fp16": 0, "int8": 1, "fp8": 2}
# triton.jit is unannotated; kernels are launch objects (JITFunction or InterpretedFunction)
jit: Callable[[Callable[..., Any]], Any] = triton.jit


@jit
def decode_e4m3(code: Any) -> Any:
    """fp8 e4m3fn bytes -> fp32: sign | 4-bit exponent (bias 7) | 3-bit mantissa; exponent 0
    is subnormal (m * 2^-9), 0x7F/0xFF are NaN (e4m3fn has no infinities)."""
    b = code.to(tl.int32) & 0xFF
    e = (b >> 3) & 0xF
    m = b & 0x7
    # a normal e4m3 value re-biased into fp32's 8-bit exponent (bias 127): e - 7 + 127
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    subnormal = m.to(tl.float32) * 0.001953125  # 2^-9
    mag = tl.where(e == 0, subnormal, normal)
    mag = tl.where((b & 0x7F) == 0x7F, float("nan"), mag)
    # the sign as a bit, not a negation: negation can be lowered to 0 - x, which loses -0.0
    return (mag.to(tl.int32, bitcast=True) | ((b & 0x80) << 24)).to(tl.float32, bitcast=True)


@jit
def _decode_kernel(code_ptr: Any, out_ptr: Any, n: Any, BLOCK: tl.constexpr) -> None:
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    code = tl.load(code_ptr + offs, mask=mask, other=0)
    tl.store(out_ptr + offs, decode_e4m3(code), mask=mask)


@jit
def _linear_kernel(
    x_ptr: Any,
    w_ptr: Any,
    scale_ptr: Any,
    bias_ptr: Any,
    y_ptr: Any,
    M: Any,
    N: Any,
    K: Any,
    stride_xm: Any,
    stride_wn: Any,
    stride_ym: Any,
    WEIGHT_KIND: tl.constexpr,  # 0 float, 1 int8, 2 fp8 e4m3 codes
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    COMPUTE: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
) -> None:
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        mask_k = kk < K
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + kk[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0
        ).to(COMPUTE)
        # the weight tile read transposed, [BLOCK_K, BLOCK_N], straight from its stored bytes
        raw = tl.load(
            w_ptr + offs_n[None, :] * stride_wn + kk[:, None], mask=mask_k[:, None] & mask_n[None, :], other=0
        )
        if WEIGHT_KIND == 2:
            w = decode_e4m3(raw).to(COMPUTE)
        elif WEIGHT_KIND == 1:
            w = raw.to(tl.float32).to(COMPUTE)
        else:
            w = raw.to(COMPUTE)
        if IEEE:
            acc += tl.dot(x, w, input_precision="ieee")
        else:
            acc += tl.dot(x, w)
    if HAS_SCALE:
        acc = acc * tl.load(scale_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], acc, mask=mask_m[:, None] & mask_n[None, :])


@jit
def _packed_attention_kernel(
    qkv_ptr: Any,
    out_ptr: Any,
    offsets_ptr: Any,
    stride_qkv: Any,
    stride_out: Any,
    D: Any,
    DH: Any,
    scale: Any,
    COMPUTE: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
) -> None:
    pid_m = tl.program_id(0)
    seg = tl.program_id(1)
    head = tl.program_id(2)
    start = tl.load(offsets_ptr + seg)
    n = tl.load(offsets_ptr + seg + 1) - start
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < n
    mask_d = offs_d < DH
    col = head * DH + offs_d  # this head's columns of q; k and v are D and 2D further
    q = tl.load(
        qkv_ptr + (start + offs_m)[:, None] * stride_qkv + col[None, :],
        mask=mask_m[:, None] & mask_d[None, :],
        other=0.0,
    ).to(COMPUTE)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    hi = tl.where(m0 < n, n, 0)  # a query block past its (short) segment's end does no work
    for n0 in range(0, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < n
        kv_rows = (start + offs_n)[:, None] * stride_qkv
        kv_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(qkv_ptr + kv_rows + D + col[None, :], mask=kv_mask, other=0.0).to(COMPUTE)
        v = tl.load(qkv_ptr + kv_rows + 2 * D + col[None, :], mask=kv_mask, other=0.0).to(COMPUTE)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(mask_n[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IEEE:
            pv = tl.dot(p.to(COMPUTE), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(COMPUTE), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    # rows past the segment's end keep l_i = 0 (never stored): divide by 1 there, not by 0
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(
        out_ptr + (start + offs_m)[:, None] * stride_out + col[None, :], out, mask=mask_m[:, None] & mask_d[None, :]
    )


def interpreted() -> bool:
    """Whether this import's kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return isinstance(_linear_kernel, InterpretedFunction)


def _block(n: int, low: int = 16, high: int = 64) -> int:
    # tl.dot needs every tile dim >= 16; larger tiles only for dims that fill them
    return max(low, min(high, int(triton.next_power_of_2(max(n, 1)))))


@dataclass
class PackedWeight:
    """One Linear's weight as stored: ``data_NK`` (float32/float16, int8, or uint8 e4m3 codes),
    ``scale_N`` fp32 per output channel (int8/fp8) and ``bias_N`` fp32."""

    kind: str
    data_NK: torch.Tensor
    scale_N: torch.Tensor | None
    bias_N: torch.Tensor | None

    def __post_init__(self) -> None:
        if self.kind not in WEIGHT_KINDS:
            raise ValueError(f"weight kind {self.kind!r} is not one of {WEIGHT_KINDS}")
        if (self.scale_N is None) != (self.kind in ("fp32", "fp16")):
            raise ValueError(f"{self.kind} weights {'need' if self.scale_N is None else 'take no'} per-channel scales")
        if self.kind == "fp8" and self.data_NK.dtype == torch.float8_e4m3fn:
            self.data_NK = self.data_NK.view(torch.uint8)  # same bytes; the kernel decodes them

    @property
    def out_features(self) -> int:
        return int(self.data_NK.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.data_NK.shape[1])

    @property
    def nbytes(self) -> int:
        parts = [t for t in (self.data_NK, self.scale_N, self.bias_N) if t is not None]
        return sum(t.numel() * t.element_size() for t in parts)


def linear(x_MK: torch.Tensor, weight: PackedWeight, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``x @ dequant(W)^T + bias`` as fp32 ``[M, N]``; ``x_MK`` may have any leading shape."""
    lead = x_MK.shape[:-1]
    x2 = x_MK.reshape(-1, x_MK.shape[-1]).contiguous()
    M, K = x2.shape
    N = weight.out_features
    if weight.in_features != K:
        raise ValueError(f"linear: input has {K} features, the weight expects {weight.in_features}")
    y = torch.empty(M, N, device=x2.device, dtype=torch.float32)
    if M == 0:
        return y.reshape(*lead, N)
    w = weight.data_NK
    scale = weight.scale_N if weight.scale_N is not None else y  # unread when HAS_SCALE is False
    bias = weight.bias_N if weight.bias_N is not None else y
    BM, BN, BK = _block(M, high=64), _block(N, high=64), _block(K, high=32)
    grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
    _linear_kernel[grid](
        x2,
        w,
        scale,
        bias,
        y,
        M,
        N,
        K,
        x2.stride(0),
        w.stride(0),
        y.stride(0),
        WEIGHT_KIND=_KIND_CODE[weight.kind],
        HAS_SCALE=weight.scale_N is not None,
        HAS_BIAS=weight.bias_N is not None,
        COMPUTE=COMPUTE_DTYPES[compute_dtype],
        IEEE=compute_dtype == torch.float32,
        BLOCK_M=BM,
        BLOCK_N=BN,
        BLOCK_K=BK,
    )
    return y.reshape(*lead, N)


def packed_attention(
    qkv_N3D: torch.Tensor,
    offsets_S1: torch.Tensor,
    max_length: int,
    heads: int,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Softmax attention within each segment of packed tokens: ``[N_tok, 3*D]`` -> ``[N_tok, D]`` fp32.

    ``offsets_S1`` (int32, ``S + 1`` entries, first 0, last ``N_tok``) bounds the segments;
    ``max_length`` is the longest segment (sizes the grid; the caller knows it)."""
    N, three_d = qkv_N3D.shape
    if three_d % 3:
        raise ValueError(f"packed_attention: qkv width {three_d} is not 3 * d_model")
    D = three_d // 3
    if D % heads:
        raise ValueError(f"packed_attention: d_model {D} is not divisible by heads={heads}")
    DH = D // heads
    qkv = qkv_N3D.contiguous()
    out = torch.empty(N, D, device=qkv.device, dtype=torch.float32)
    S = offsets_S1.numel() - 1
    if N == 0 or S <= 0:
        return out
    BM = _block(max_length, high=64)
    BN = _block(max_length, high=64)
    BD = _block(DH, high=256)
    grid = (triton.cdiv(max_length, BM), S, heads)
    _packed_attention_kernel[grid](
        qkv,
        out,
        offsets_S1.to(torch.int32).contiguous(),
        qkv.stride(0),
        out.stride(0),
        D,
        DH,
        1.0 / DH**0.5,  # SDPA's default scale
        COMPUTE=COMPUTE_DTYPES[compute_dtype],
        IEEE=compute_dtype == torch.float32,
        BLOCK_M=BM,
        BLOCK_N=BN,
        BLOCK_D=BD,
    )
    return out


def decode_fp8(codes: torch.Tensor) -> torch.Tensor:
    """The kernels' e4m3 decode on its own (uint8 codes -> fp32), for checking it bit for bit."""
    flat = codes.reshape(-1).contiguous()
    out = torch.empty(flat.numel(), device=flat.device, dtype=torch.float32)
    if flat.numel():
        _decode_kernel[(triton.cdiv(flat.numel(), 256),)](flat, out, flat.numel(), BLOCK=256)
    return out.reshape(codes.shape)
