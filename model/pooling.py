"""Reductions: how a node instance's encoded tokens become one vector for its parent.

- ``mean``: average over present tokens (plain tensor ops, stays eager, not a region).
- ``attention``: learned-query attention pool ("learned attention reduction"), one compile
  region per node.

Both take ``x_NSD`` and an optional ``mask_NS`` (True = present). The packed path calls them
with dense, fully present sequences and ``mask_NS=None``; the padded path passes the mask.
Instances with no present token produce finite garbage here (the attention pool attends to
all tokens of such an instance, the mean divides by max(count, 1)); the caller replaces
those rows with the learned empty-branch vector, so neither NaN values nor NaN gradients
can appear.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def mean_pool(x_NSD: torch.Tensor, mask_NS: torch.Tensor | None = None) -> torch.Tensor:
    if mask_NS is None:
        return x_NSD.mean(dim=1)
    weight_NS1 = mask_NS.unsqueeze(-1).to(x_NSD.dtype)
    count_N1 = weight_NS1.sum(dim=1).clamp(min=1.0)
    return (x_NSD * weight_NS1).sum(dim=1) / count_N1


class AttentionPool(nn.Module):
    """Single learned query; keys are a linear map of the tokens, values the tokens."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.query = nn.Parameter(torch.randn(d_model) * 0.02)
        self.key = nn.Linear(d_model, d_model)
        self.scale = 1.0 / math.sqrt(d_model)

    def forward(self, x_NSD: torch.Tensor, mask_NS: torch.Tensor | None = None) -> torch.Tensor:
        score_NS = (self.key(x_NSD) @ self.query) * self.scale
        if mask_NS is not None:
            mask_NS = mask_NS | ~mask_NS.any(dim=-1, keepdim=True)
            score_NS = score_NS.masked_fill(~mask_NS, float("-inf"))
        weight_NS = torch.softmax(score_NS, dim=-1)
        return torch.einsum("ns,nsd->nd", weight_NS, x_NSD)


STOCK_POOL_TYPES: frozenset[type[nn.Module]] = frozenset({AttentionPool, nn.Linear})
