"""Running one node's encoder over its instances: the padded path and the packed path.

A *node instance* is the set of rows of one node under one parent row (the root: one row
per example). With ``P`` instances of ``L`` reserved rows and ``T`` tokens per row, the
padded layout is ``[P, L*T, D]``.

- Padded path: embed every reserved row, run the stack on ``[P, L*T, D]`` with a
  key-padding mask, pool with the mask. Used with ``packing="off"``, active dropout, or a
  customized/hooked encoder region.
- Packed path: present rows are a prefix of each instance's reserved rows (batch contract),
  so an instance is fully described by its present-row count ``n``. Instances with ``n=0``
  are dropped (they get the empty-branch vector); the rest are grouped by ``n`` (at most
  ``L`` groups) and each group runs dense attention on exactly ``n*T`` tokens with no mask
  and no padding. Only present rows are embedded. On CPU this length-bucketed dense
  attention was the fastest packed kernel in trials (jagged nested tensors ~10x slower);
  ``torch.nn.attention.varlen`` (CUDA, bf16/fp16) is a possible later kernel, not used yet.

Both paths use the same layer code, so they agree to fp32 round-off (tested at 1e-5).
Outputs at absent rows are zero in both paths; empty instances pool to ``empty_D``.

Row outputs (per present row, ``[P, L, D]``): ``"target"`` = output token of the target
column, ``"leaf"`` = mean of the row's output tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

Embed = Callable[..., torch.Tensor]
Stack = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
Pool = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]


@dataclass
class NodeRows:
    """One node's inputs flattened to instances: ``[P, L, ...]``."""

    present_PL: torch.Tensor
    continuous_PLC: torch.Tensor
    continuous_null_PLC: torch.Tensor
    categorical_PLK: torch.Tensor
    children_PLKD: torch.Tensor | None  # pooled child vectors, one per child branch
    text_PLXE: torch.Tensor | None = None  # text cells' vectors (nodes with text columns)
    text_null_PLX: torch.Tensor | None = None


@dataclass
class NodeResult:
    pooled_PD: torch.Tensor | None
    rows: dict[str, torch.Tensor]  # name -> [P, L, D]


def _row_output(name: str, y_GnTD: torch.Tensor, target_index: int | None) -> torch.Tensor:
    if name == "target":
        assert target_index is not None
        return y_GnTD[:, :, target_index]
    return y_GnTD.mean(dim=2)


def encode_padded(
    rows: NodeRows,
    embed: Embed,
    stack: Stack,
    pool: Pool | None,
    empty_D: torch.Tensor,
    row_outputs: tuple[str, ...],
    target_index: int | None,
) -> NodeResult:
    P, L = rows.present_PL.shape
    position_L = torch.arange(L, device=rows.present_PL.device)
    x_PLTD = embed(
        rows.continuous_PLC,
        rows.continuous_null_PLC,
        rows.categorical_PLK,
        rows.children_PLKD,
        position_L,
        text_RXE=rows.text_PLXE,
        text_null_RX=rows.text_null_PLX,
    )
    T, D = x_PLTD.shape[-2:]
    mask_PS = rows.present_PL.unsqueeze(-1).expand(P, L, T).reshape(P, L * T)
    y_PSD = stack(x_PLTD.reshape(P, L * T, D), mask_PS)
    pooled_PD = None
    if pool is not None:
        nonempty_P1 = rows.present_PL.any(dim=1, keepdim=True)
        pooled_PD = torch.where(nonempty_P1, pool(y_PSD, mask_PS), empty_D)
    y_PLTD = y_PSD.view(P, L, T, D)
    present_PL1 = rows.present_PL.unsqueeze(-1)
    out = {}
    for name in row_outputs:
        r_PLD = _row_output(name, y_PLTD, target_index)
        out[name] = torch.where(present_PL1, r_PLD, torch.zeros_like(r_PLD))
    return NodeResult(pooled_PD, out)


def encode_packed(
    rows: NodeRows,
    embed: Embed,
    stack: Stack,
    pool: Pool | None,
    empty_D: torch.Tensor,
    row_outputs: tuple[str, ...],
    target_index: int | None,
) -> NodeResult:
    P, L = rows.present_PL.shape
    device = rows.present_PL.device
    count_P = rows.present_PL.sum(dim=1)
    position_L = torch.arange(L, device=device)
    instance_parts: list[torch.Tensor] = []  # instance ids, in the order pooled parts come
    pooled_parts: list[torch.Tensor] = []
    row_index_parts: list[torch.Tensor] = []  # flat P*L row ids of row outputs
    row_parts: dict[str, list[torch.Tensor]] = {name: [] for name in row_outputs}
    for n in torch.unique(count_P).tolist():  # host sync: group shapes need it
        index_G = (count_P == n).nonzero().squeeze(1)
        if n == 0:
            if pool is not None:
                instance_parts.append(index_G)
                pooled_parts.append(empty_D.expand(index_G.numel(), -1))
            continue
        G = index_G.numel()
        children = rows.children_PLKD
        x_GnTD = embed(
            rows.continuous_PLC[index_G, :n],
            rows.continuous_null_PLC[index_G, :n],
            rows.categorical_PLK[index_G, :n],
            None if children is None else children[index_G, :n],
            position_L[:n],
            text_RXE=None if rows.text_PLXE is None else rows.text_PLXE[index_G, :n],
            text_null_RX=None if rows.text_null_PLX is None else rows.text_null_PLX[index_G, :n],
        )
        T, D = x_GnTD.shape[-2:]
        y_GSD = stack(x_GnTD.reshape(G, n * T, D), None)
        if pool is not None:
            instance_parts.append(index_G)
            pooled_parts.append(pool(y_GSD, None))
        if row_outputs:
            y_GnTD = y_GSD.view(G, n, T, D)
            row_index_parts.append((index_G.unsqueeze(1) * L + position_L[:n]).reshape(-1))
            for name in row_outputs:
                row_parts[name].append(_row_output(name, y_GnTD, target_index).reshape(G * n, D))

    pooled_PD = None
    if pool is not None:
        dtype = functools.reduce(torch.promote_types, [p.dtype for p in pooled_parts])
        values = torch.cat([p.to(dtype) for p in pooled_parts])
        pooled_PD = values.new_zeros(P, values.shape[-1]).index_copy(0, torch.cat(instance_parts), values)
    out = {}
    D = empty_D.shape[-1]
    for name in row_outputs:
        if row_parts[name]:
            values = torch.cat(row_parts[name])
            flat = values.new_zeros(P * L, D).index_copy(0, torch.cat(row_index_parts), values)
        else:  # every instance empty
            flat = empty_D.new_zeros(P * L, D)
        out[name] = flat.view(P, L, D)
    return NodeResult(pooled_PD, out)
