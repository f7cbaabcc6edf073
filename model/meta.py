"""Meta-device inspection: parameter count, FLOPs per root row and output shapes without
allocating weights.

Design choices:
- The model is built under ``torch.device("meta")``: parameters have shapes, no storage, so
  any architecture can be inspected on a laptop.
- FLOPs are counted from *reserved* token counts (every reserved row present, padded path,
  one root row), i.e. the cost the schema reserves, not what a given dataset fills; pass
  ``outputs`` to count a particular output selection. Counting uses
  ``torch.utils.flop_counter.FlopCounterMode`` on meta tensors (matmuls and attention;
  element-wise ops are not counted), forward only.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.utils.flop_counter import FlopCounterMode

from .batch import Batch, NodeTensors
from .config import ModelConfig
from .schema import ModelSchema
from .transformer import RelationalTransformer


def full_meta_batch(schema: ModelSchema, batch_size: int = 1) -> Batch:
    """Every reserved row present, on the meta device."""
    meta = torch.device("meta")
    nodes = {}
    for node in schema.root.walk():
        shape = (batch_size, *schema.reserved_shape(node.name))
        C, K = len(node.continuous), len(node.categorical)
        nodes[node.name] = NodeTensors(
            present=torch.ones(shape, dtype=torch.bool, device=meta),
            continuous=torch.zeros(*shape, C, device=meta),
            continuous_null=torch.zeros(*shape, C, dtype=torch.bool, device=meta),
            categorical=torch.zeros(*shape, K, dtype=torch.long, device=meta),
        )
        if node.text:
            nodes[node.name].text = torch.zeros(*shape, len(node.text), node.text[0].width, device=meta)
            nodes[node.name].text_null = torch.zeros(*shape, len(node.text), dtype=torch.bool, device=meta)
    label_shape = (batch_size, *schema.reserved_shape(schema.target.node))
    labels = torch.zeros(label_shape, device=meta)
    return Batch(nodes, labels, torch.ones(label_shape, dtype=torch.bool, device=meta))


def inspect_on_meta(
    schema: ModelSchema,
    config: ModelConfig | None = None,
    outputs: Iterable[str] = ("prediction", "root_embedding"),
) -> dict[str, int]:
    """``{"parameters": int, "flops_per_root_row": int}`` for ``schema`` and ``config``."""
    with torch.device("meta"):
        model = RelationalTransformer(schema, config)
    model.eval()
    model.packing = "off"  # packing needs real present-row counts; reserved = all present
    parameters = sum(p.numel() for p in model.parameters())
    batch = full_meta_batch(schema)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(batch, outputs=tuple(outputs))
    return {"parameters": int(parameters), "flops_per_root_row": int(counter.get_total_flops())}


def output_shapes_on_meta(
    schema: ModelSchema, config: ModelConfig | None, outputs: Iterable[str]
) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{output: (dtype name, shape)}`` of a forward pass, batch dimension as -1 (meta device:
    nothing is allocated or computed)."""
    with torch.device("meta"):
        model = RelationalTransformer(schema, config)
    model.eval()
    model.packing = "off"
    with torch.no_grad():
        out = model(full_meta_batch(schema), outputs=tuple(outputs))
    return {k: (str(v.dtype).removeprefix("torch."), (-1, *v.shape[1:])) for k, v in out.items()}
