"""ONNX export: the padded forward over flat tensors, with dynamic batch and cell axes.

``ExportForward`` wraps a trained ``RelationalTransformer`` as a module whose inputs are
plain tensors (per node, in pre-order: ``present``, ``continuous``, ``continuous_null``,
``categorical``, plus ``text`` and ``text_null`` for nodes with text columns) and whose
outputs are the selected outputs in order. ``export_onnx`` runs
``torch.onnx.export(..., dynamo=True)`` with ``dynamic_shapes``:

- one ``batch`` dimension shared by every input's first axis;
- one length dimension per branch (``len_<branch>``, 1..max_length), shared by that
  branch's axis in its own tensors and in every descendant's, so a caller may pad each
  branch to any length up to its reserved one (e.g. the longest present in the batch).

Design choices:
- Always the padded path: the packed path groups instances by present-row count on the
  host (``torch.unique(...).tolist()``), a data-dependent shape that torch.export cannot
  capture. Padded + masked attention gives the same numbers (tested to 1e-5).
- Data-dependent checks become fixed-shape masked operations: the eager model raises on a
  category index outside its column's table (``CoordinateEncoder.check``, a host sync on a
  boolean reduction); the exported graph instead maps such an index to the column's
  unknown slot with ``torch.where``. Shapes come from the inputs, never from ``int()`` of
  a size, so no axis is specialised.
- Example inputs use the reserved lengths and a batch of 2 (sizes 0 and 1 are specialised
  by torch.export); tests run the file at several batch sizes and lengths.
- Imports torch only. ``torch.onnx`` needs the ``onnx`` and ``onnxscript`` packages.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .batch import Batch, NodeTensors
from .packing import NodeRows, encode_padded
from .pooling import mean_pool
from .schema import UNKNOWN_INDEX, NodeDef
from .transformer import RelationalTransformer

FIELDS = ("present", "continuous", "continuous_null", "categorical")
TEXT_FIELDS = ("text", "text_null")  # nodes with text columns only (see model/batch.py)
EXAMPLE_BATCH = 2


def node_fields(node: NodeDef) -> tuple[str, ...]:
    """The ``NodeTensors`` fields a node feeds the exported graph, in order."""
    return FIELDS + TEXT_FIELDS if node.text else FIELDS


def output_name(output: str) -> str:
    """ONNX output names: the model's output names with ':' spelled '__'."""
    return output.replace(":", "__")


@dataclass(frozen=True)
class ExportSignature:
    """What the exported graph takes and returns, in order (stored with the file)."""

    nodes: tuple[str, ...]  # pre-order
    inputs: tuple[str, ...]  # "<node>.<field>"
    outputs: tuple[str, ...]  # model output names ("prediction", "branch_embedding:b", ...)
    dims: dict[str, dict[int, str]]  # input name -> axis -> dynamic dim name

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": list(self.nodes),
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "onnx_outputs": [output_name(o) for o in self.outputs],
            "dims": {k: {str(a): d for a, d in v.items()} for k, v in self.dims.items()},
        }


class ExportForward(nn.Module):
    """The model's padded forward over flat tensors (see the module docstring)."""

    def __init__(self, model: RelationalTransformer, outputs: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.outputs = model._parse_outputs(outputs)
        self.nodes = model.schema.root.walk()
        self.encode, self.want_pool, self.row_outputs = model.output_plan(self.outputs)

    def signature(self) -> ExportSignature:
        schema = self.model.schema
        inputs, dims = [], {}
        for node in self.nodes:
            axes = {0: "batch"}
            for i, level in enumerate(schema.path(node.name)[1:], start=1):
                if level.max_length > 1:
                    axes[i] = f"len_{level.name}"
            for f in node_fields(node):
                inputs.append(f"{node.name}.{f}")
                dims[f"{node.name}.{f}"] = dict(axes)
        return ExportSignature(tuple(n.name for n in self.nodes), tuple(inputs), self.outputs, dims)

    def flat_inputs(self, batch: Batch) -> tuple[torch.Tensor, ...]:
        flat: list[torch.Tensor] = []
        for n in self.nodes:
            t = batch.nodes[n.name]
            for f in node_fields(n):
                value = getattr(t, f)
                if value is None:
                    raise ValueError(f"batch node {n.name!r} has no {f} tensor; encode it with the model's schema")
                flat.append(value)
        return tuple(flat)

    def _rows(self, node: NodeDef, t: NodeTensors, children: list[torch.Tensor]) -> NodeRows:
        coord = self.model._coordinates(node.name)
        shape = t.present.shape  # [B] for the root, [B, L1..Ld] for a branch
        L = shape[-1] if len(shape) > 1 else 1
        present_PL = t.present.reshape(-1, L)
        C, K = len(node.continuous), len(node.categorical)
        P = present_PL.shape[0]
        continuous = t.continuous.reshape(P, L, C)
        null = t.continuous_null.reshape(P, L, C)
        categorical = t.categorical.reshape(P, L, K)
        present_PL1 = present_PL.unsqueeze(-1)
        continuous = torch.where(present_PL1 & ~null, continuous, torch.zeros_like(continuous))
        null = null & present_PL1
        categorical = torch.where(present_PL1, categorical, torch.zeros_like(categorical))
        text = text_null = None
        if node.text:  # as RelationalTransformer._node_rows: nulls and absent rows carry zeros
            assert t.text is not None and t.text_null is not None
            X, E = len(node.text), node.text[0].width
            text_null = t.text_null.reshape(P, L, X) & present_PL1
            text = t.text.reshape(P, L, X, E)
            text = torch.where(text_null.unsqueeze(-1) | ~present_PL1.unsqueeze(-1), torch.zeros_like(text), text)
        if K:  # fixed-shape stand-in for CoordinateEncoder.check: out of range -> unknown
            bad = (categorical < 0) | (categorical >= coord.category_cardinality_K)
            categorical = torch.where(bad, torch.full_like(categorical, UNKNOWN_INDEX), categorical)
        children_PLKD = None
        if children:
            children_PLKD = torch.stack([c.reshape(P, L, -1) for c in children], dim=2)
        return NodeRows(present_PL, continuous, null, categorical, children_PLKD, text, text_null)

    def forward(self, *flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        model = self.model
        tensors: dict[str, NodeTensors] = {}
        at = 0
        for n in self.nodes:
            k = len(node_fields(n))
            tensors[n.name] = NodeTensors(*flat[at : at + k])
            at += k
        pooled: dict[str, torch.Tensor] = {}
        rows_out: dict[str, dict[str, torch.Tensor]] = {}
        for node in reversed(self.nodes):  # children before parents
            name = node.name
            if name not in self.encode:
                continue
            t = tensors[name]
            rows = self._rows(node, t, [pooled[c.name] for c in node.children])
            pool = None
            if name in self.want_pool:
                pool = model.pools[name] if name in model.pools else mean_pool  # noqa: SIM401 (no ModuleDict.get)
            result = encode_padded(
                rows,
                model.coordinates[name],
                model.encoders[name],
                pool,
                model.empty[name],
                tuple(self.row_outputs.get(name, ())),
                model._coordinates(name).target_index,
            )
            row_shape = t.present.shape if t.present.dim() > 1 else (t.present.shape[0], 1)
            if result.pooled_PD is not None:
                pooled[name] = result.pooled_PD.reshape(*row_shape[:-1], -1)
            rows_out[name] = {k: v.reshape(*row_shape, -1) for k, v in result.rows.items()}
        out = model.collect_outputs(self.outputs, pooled, rows_out)
        return tuple(out[o] for o in self.outputs)


def example_batch(
    model: RelationalTransformer, batch_size: int = EXAMPLE_BATCH, lengths: dict[str, int] | None = None
) -> Batch:
    """A batch of the given size and per-branch padded lengths (default: reserved), every
    row present; values are irrelevant to tracing (the graph has no data-dependent flow)."""
    schema = model.schema
    lengths = lengths or {}
    device = model.device
    nodes = {}
    for node in schema.root.walk():
        dims = tuple(lengths.get(n.name, n.max_length) for n in schema.path(node.name)[1:])
        shape = (batch_size, *dims)
        C, K, X = len(node.continuous), len(node.categorical), len(node.text)
        E = node.text[0].width if X else 0
        nodes[node.name] = NodeTensors(
            present=torch.ones(shape, dtype=torch.bool, device=device),
            continuous=torch.zeros(*shape, C, device=device),
            continuous_null=torch.zeros(*shape, C, dtype=torch.bool, device=device),
            categorical=torch.zeros(*shape, K, dtype=torch.long, device=device),
            text=torch.zeros(*shape, X, E, device=device) if X else None,
            text_null=torch.zeros(*shape, X, dtype=torch.bool, device=device) if X else None,
        )
    empty = torch.zeros(0, device=device)
    return Batch(nodes, empty, empty.bool())


def dynamic_shapes(sig: ExportSignature, model: RelationalTransformer) -> tuple[dict[int, Any], ...]:
    """torch.export ``Dim``s per input, one object per dim name so equal names are tied."""
    maxima = {"batch": None, **{f"len_{n.name}": n.max_length for n in model.schema.root.walk() if n.max_length > 1}}
    made: dict[str, Any] = {}
    for name, top in maxima.items():
        made[name] = torch.export.Dim(name, min=1) if top is None else torch.export.Dim(name, min=1, max=top)
    return tuple({axis: made[d] for axis, d in sig.dims[i].items()} for i in sig.inputs)


def export_onnx(
    model: RelationalTransformer, outputs: tuple[str, ...], path: str | Path, opset: int | None = None
) -> ExportSignature:
    """Write the model's padded forward for ``outputs`` to ``path`` (one self-contained file)."""
    model = model.eval()
    wrapper = ExportForward(model, outputs).eval()
    sig = wrapper.signature()
    args = wrapper.flat_inputs(example_batch(model))
    with torch.no_grad():
        program = torch.onnx.export(
            wrapper,
            args,
            dynamo=True,
            dynamic_shapes=(dynamic_shapes(sig, model),),
            input_names=list(sig.inputs),
            output_names=[output_name(o) for o in sig.outputs],
            opset_version=opset,
            external_data=False,
            verbose=False,
        )
    if program is None:  # dynamo=True always returns a program; None is the legacy exporter's
        raise RuntimeError("torch.onnx.export returned no ONNX program")
    program.save(str(path), external_data=False)
    return sig
