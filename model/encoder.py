"""Branch sequence encoder stack: a small pre-norm transformer over one node's tokens.

Design choices:
- Our own layer on ``scaled_dot_product_attention`` instead of ``nn.TransformerEncoderLayer``
  (whose fast paths switch kernels depending on masks and training mode), so the packed
  path (dense, no mask) and the padded path (key-padding mask) run the same math and agree
  to fp32 round-off.
- ``forward(x_NSD, mask_NS=None)``: ``mask_NS`` is True for present tokens. A sequence with
  no present token would make SDPA return NaN (softmax over nothing); such rows attend to
  everything instead. Their outputs are garbage by construction and the caller discards
  them (they get the learned empty-branch vector), so no NaN reaches values or gradients.
- Pre-norm residual blocks and a final LayerNorm; dropout on attention weights and on both
  residual branches, active only in training.
- The stack is one *compile region*: it has no data-dependent control flow, so it can be
  wrapped with ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .quantize import Fp8Linear


class SelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x_NSD: torch.Tensor, attn_mask_N11S: torch.Tensor | None) -> torch.Tensor:
        N, S, D = x_NSD.shape
        qkv = self.qkv(x_NSD).view(N, S, 3, self.heads, D // self.heads)
        q_NHSd, k_NHSd, v_NHSd = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        y_NHSd = F.scaled_dot_product_attention(
            q_NHSd,
            k_NHSd,
            v_NHSd,
            attn_mask=attn_mask_N11S,
            dropout_p=self.dropout if self.training else 0.0,
        )
        out_NSD: torch.Tensor = self.out(y_NHSd.transpose(1, 2).reshape(N, S, D))
        return out_NSD


class FeedForward(nn.Module):
    def __init__(self, d_model: int, ffn_mult: int) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, ffn_mult * d_model)
        self.act = nn.GELU()
        self.down = nn.Linear(ffn_mult * d_model, d_model)

    def forward(self, x_NSD: torch.Tensor) -> torch.Tensor:
        y_NSD: torch.Tensor = self.down(self.act(self.up(x_NSD)))
        return y_NSD


class EncoderLayer(nn.Module):
    def __init__(self, d_model: int, heads: int, dropout: float, ffn_mult: int) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, heads, dropout)
        self.ffn_norm = nn.LayerNorm(d_model)
        self.ffn = FeedForward(d_model, ffn_mult)
        self.drop = nn.Dropout(dropout)

    def forward(self, x_NSD: torch.Tensor, attn_mask_N11S: torch.Tensor | None) -> torch.Tensor:
        x_NSD = x_NSD + self.drop(self.attn(self.attn_norm(x_NSD), attn_mask_N11S))
        ffn_NSD: torch.Tensor = self.drop(self.ffn(self.ffn_norm(x_NSD)))
        return x_NSD + ffn_NSD


class EncoderStack(nn.Module):
    """``layers`` pre-norm blocks + final norm over ``[N, S, D]`` token sequences."""

    def __init__(self, d_model: int, layers: int, heads: int, dropout: float, ffn_mult: int):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(d_model, heads, dropout, ffn_mult) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x_NSD: torch.Tensor, mask_NS: torch.Tensor | None = None) -> torch.Tensor:
        attn_mask_N11S = None
        if mask_NS is not None:
            # An instance with no present token attends to all tokens (outputs discarded).
            mask_NS = mask_NS | ~mask_NS.any(dim=-1, keepdim=True)
            attn_mask_N11S = mask_NS[:, None, None, :]
        for layer in self.layers:
            x_NSD = layer(x_NSD, attn_mask_N11S)
        normed_NSD: torch.Tensor = self.norm(x_NSD)
        return normed_NSD


# Module types a stock (un-customized) encoder region is made of. A region containing any
# other type -- including a subclass of one of these -- counts as customized.
STOCK_ENCODER_TYPES: frozenset[type[nn.Module]] = frozenset(
    {
        EncoderStack,
        EncoderLayer,
        SelfAttention,
        FeedForward,
        nn.ModuleList,
        nn.Linear,
        nn.LayerNorm,
        nn.GELU,
        nn.Dropout,
        Fp8Linear,  # native fp8 weights (a quantized checkpoint on supported CUDA)
    }
)
