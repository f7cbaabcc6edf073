"""Synthetic batches that honour the batch contract, for tests, benchmarks and inspection.

Per branch instance the number of present rows is ``Binomial(L, fill)`` (so some instances
are empty), present rows form a prefix, and rows under absent parents are absent. Values
are standard normal / uniform category indices, with ``null_rate`` nulls. The target
column holds a placeholder (NaN or -1) that the model must ignore; labels are random.
"""

from __future__ import annotations

import math

import torch

from .batch import Batch, NodeTensors
from .schema import ModelSchema


def random_batch(
    schema: ModelSchema,
    batch_size: int,
    fill: float | dict[str, float] = 0.5,
    null_rate: float = 0.1,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> Batch:
    """``fill``: expected fraction of reserved rows present per branch instance (a float for
    every branch, or per branch name; missing names use 0.5). ``fill=1.0`` fills everything."""
    g = torch.Generator().manual_seed(seed)
    nodes: dict[str, NodeTensors] = {}
    parent_present: dict[str, torch.Tensor] = {}
    target = schema.target
    for node in schema.root.walk():  # parents first
        reserved = schema.reserved_shape(node.name)
        shape = (batch_size, *reserved)
        if not reserved:
            present = torch.ones(batch_size, dtype=torch.bool)
        else:
            rate = fill if isinstance(fill, float | int) else fill.get(node.name, 0.5)
            L = reserved[-1]
            count = torch.distributions.Binomial(L, torch.tensor(float(rate))).sample(shape[:-1])
            count = torch.where(parent_present[node.name], count, torch.zeros_like(count))
            present = torch.arange(L) < count.unsqueeze(-1)
        for child in node.children:
            parent_present[child.name] = present
        C, K = len(node.continuous), len(node.categorical)
        continuous = torch.randn(*shape, C, generator=g)
        null = (torch.rand(*shape, C, generator=g) < null_rate) & present.unsqueeze(-1)
        continuous = torch.where(null | ~present.unsqueeze(-1), 0.0, continuous)
        cards = torch.tensor([c.cardinality for c in node.categorical], dtype=torch.float)
        categorical = (torch.rand(*shape, K, generator=g) * cards).long()
        cat_null = torch.rand(*shape, K, generator=g) < null_rate
        categorical = torch.where(cat_null | ~present.unsqueeze(-1), 0, categorical)
        if node.name == target.node:
            names = [c.name for c in (*node.continuous, *node.categorical)]
            i = names.index(target.column)
            if i < C:
                continuous[..., i] = math.nan
                null[..., i] = False
            else:
                categorical[..., i - C] = -1
        nodes[node.name] = NodeTensors(present, continuous, null, categorical)
    label_shape = (batch_size, *schema.reserved_shape(target.node))
    target_present = nodes[target.node].present
    if target.kind == "category":
        labels = torch.randint(0, target.num_classes, label_shape, generator=g)
    elif target.kind == "binary":
        labels = (torch.rand(label_shape, generator=g) < 0.5).float()
    else:
        labels = torch.randn(label_shape, generator=g)
    label_present = target_present & (torch.rand(label_shape, generator=g) > 0.1)
    return Batch(nodes, labels, label_present).to(device)


def occupancy(batch: Batch, schema: ModelSchema) -> float:
    """Present / reserved coordinates (cells) over all nodes."""
    present = reserved = 0
    for node in schema.root.walk():
        tokens = len(node.columns) + len(node.children)
        p = batch.nodes[node.name].present
        present += int(p.sum()) * tokens
        reserved += p.numel() * tokens
    return present / reserved
