"""FLOPs of the coordinates actually present (issue 19), for ``compute.mfu``.

``model.meta.inspect_on_meta`` counts the FLOPs of the schema's **reserved** shape: every
reserved row present, packing off. Under packing and length bucketing the model does not do
that work, so an MFU from it is inflated by about 1/occupancy (more for attention, which is
quadratic in the instance length) and can exceed 1. Here each root row is counted at its own
shape: every branch cut to that root's longest present instance (at least one slot, as the
model keeps an axis for an empty branch). Root rows of the same shape share one meta-device
count, so a workload costs one inspection per distinct shape, not one per row; and one per
process, not one per phase (train and predict see the same shapes; each inspection builds a
model on the meta device, ~0.1 s).

A nested branch is cut to the longest present instance under that root (its siblings are
counted at that length too): that is what a batch of that root alone would hold, so for
nested schemas the figure is an upper bound on the present work, and exact for one level.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace

from model.config import ModelConfig
from model.meta import inspect_on_meta
from model.schema import ModelSchema, NodeDef

Shape = tuple[int, ...]
"""Present length of every non-root node, in ``schema.root.walk()`` order."""


def cut(schema: ModelSchema, shape: Shape) -> ModelSchema:
    """``schema`` with each branch's reserved length set to ``shape`` (walk order)."""
    lengths = dict(zip((n.name for n in schema.root.walk()[1:]), shape, strict=True))

    def node(n: NodeDef) -> NodeDef:
        return replace(n, max_length=max(lengths.get(n.name, n.max_length), 1), children=tuple(map(node, n.children)))

    return replace(schema, root=node(schema.root))


def flops_of_shapes(
    schema: ModelSchema, config: ModelConfig | None, outputs: Iterable[str], shapes: Counter[Shape]
) -> float:
    """Forward FLOPs of every counted root row, each at its own present shape."""
    outs = tuple(outputs)
    total = 0.0
    for shape, rows in shapes.items():
        total += float(_flops_per_root_row(cut(schema, shape), config, outs)) * rows
    return total


@functools.lru_cache(maxsize=1024)
def _flops_per_root_row(schema: ModelSchema, config: ModelConfig | None, outputs: tuple[str, ...]) -> int:
    """``inspect_on_meta``'s count, once per (schema, config, outputs): it depends on nothing else."""
    return inspect_on_meta(schema, config, outputs=outputs)["flops_per_root_row"]
