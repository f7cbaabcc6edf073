"""RelationalTransformer: cells are tokens, nodes are encoded bottom-up.

Per node instance (the root row, or the ``L`` reserved rows of one branch under one parent
row) the token sequence is row-major: per row, one token per column (continuous, then
categorical) and one per child branch (that child's pooled vector for the row). Each node
has its own coordinate encoder, its own small pre-norm encoder stack and its reduction
(``mean`` or learned ``attention`` pool); deepest branches run first and their pooled
vectors feed their parent's tokens. The root is encoded the same way and pooled into the
root embedding (``root.reduce`` is honoured too; it defaults to ``mean``).

Design choices:
- Outputs are selected: only the nodes needed for the selected outputs are encoded (a
  leaf-target prediction alone never runs the root), and pools / row outputs are computed
  only where something consumes them.
- Absent coordinates (padding, rows under absent parents) are excluded from attention and
  pooling; an instance with no present row gets a learned per-node empty vector, so roots
  with empty branches are well defined (no NaN).
- Packing is per node: ``packing="auto"`` packs a node when its encoder region is stock,
  hook-free and has no active dropout; otherwise it runs padded + masked
  (``last_encoder_path`` says which ran: "packed", "padded" or "mixed").
- ``compile(...)`` only records a selection of regions (see ``regions.py``); it is runtime
  state, dropped by copy/pickle and ``set_schema``, never in ``state_dict``.
- Outputs at absent rows are zeros (embeddings) or ``head(0)`` (predictions); they are not
  meaningful and never counted (the loss uses ``label_present``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from .batch import Batch, NodeTensors
from .config import ModelConfig
from .coordinates import CoordinateEncoder
from .encoder import STOCK_ENCODER_TYPES, EncoderStack
from .optim import AdamW, adamw
from .packing import NodeResult, NodeRows, encode_packed, encode_padded
from .pooling import STOCK_POOL_TYPES, AttentionPool, mean_pool
from .regions import CompileSettings, RegionRunner, dropout_active, has_hooks, is_stock
from .schema import UNKNOWN_INDEX, ModelSchema, NodeDef

Packing = Literal["auto", "off"]
# One node's encoder: (node, its rows, pool wanted?, row outputs) -> (result, path name).
EncodeRows = Callable[[NodeDef, NodeRows, bool, tuple[str, ...]], tuple[NodeResult, str]]
PACKING_MODES = ("auto", "off")


class RelationalTransformer(nn.Module):
    def __init__(self, schema: ModelSchema, config: ModelConfig | None = None) -> None:
        super().__init__()
        self.config = config if config is not None else ModelConfig()
        self.batch_size: int = 256  # rows per encoded batch (used by ArrowDataModule)
        self.optimizer: AdamW = adamw()
        self.packing = "auto"
        self.last_encoder_path: str | None = None  # "packed" | "padded" | "mixed"
        self.last_encoder_paths: dict[str, str] = {}  # per encoded node
        self._regions = RegionRunner()
        self._build(schema)

    # ----------------------------------------------------------------------------- build
    def _build(self, schema: ModelSchema) -> None:
        target = schema.target
        if target.kind == "category" and target.num_classes < 2:
            raise ValueError(
                f"category target {target.node}.{target.column} has num_classes="
                f"{target.num_classes}; set num_classes to the number of label classes (>= 2)"
            )
        if target.kind != "category" and target.num_classes != 1:
            raise ValueError(
                f"{target.kind} target {target.node}.{target.column} predicts one value; set "
                f"num_classes=1 (got {target.num_classes})"
            )
        cfg = self.config
        D = cfg.d_model
        self.schema = schema
        nodes = schema.root.walk()
        for n in nodes:
            if not n.name or "." in n.name:
                raise ValueError(
                    f"node name {n.name!r} must be non-empty and contain no '.'; rename it "
                    "in the schema (e.g. replace '.' with '_')"
                )
        self.coordinates = nn.ModuleDict(
            {n.name: CoordinateEncoder(n, D, target.column if n.name == target.node else None) for n in nodes}
        )
        self.encoders = nn.ModuleDict(
            {n.name: EncoderStack(D, cfg.layers, cfg.heads, cfg.dropout, cfg.ffn_mult) for n in nodes}
        )
        self.pools = nn.ModuleDict({n.name: AttentionPool(D) for n in nodes if n.reduce == "attention"})
        self.empty = nn.ParameterDict({n.name: nn.Parameter(torch.randn(D) * 0.02) for n in nodes})
        self.head = nn.Linear(D, target.num_classes)
        self._parent = {c.name: n.name for n in nodes for c in n.children}

    def set_schema(self, schema: ModelSchema) -> RelationalTransformer:
        """Rebuild for a changed schema, keeping weights whose name and shape still match.

        Compilation is not kept (call ``compile`` again)."""
        old = self.state_dict()
        device = self.device
        for name in ("coordinates", "encoders", "pools", "empty", "head"):
            delattr(self, name)
        self._build(schema)
        self.to(device)
        new = self.state_dict()
        keep = {k: v for k, v in old.items() if k in new and new[k].shape == v.shape}
        self.load_state_dict(keep, strict=False)
        self._regions.select(None)
        return self

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def packing(self) -> Packing:
        return self._packing

    @packing.setter
    def packing(self, mode: Packing) -> None:
        if mode not in PACKING_MODES:
            raise ValueError(f"packing={mode!r} is not one of {PACKING_MODES}")
        self._packing = mode

    # --------------------------------------------------------------------------- compile
    def compile(  # type: ignore[override]
        self,
        encoders: bool = True,
        pools: bool = True,
        backend: Any = "inductor",
        dynamic: bool | None = None,
        options: dict[str, Any] | None = None,
        mode: str | None = None,
    ) -> RelationalTransformer:
        """Select regions to run under ``torch.compile(fullgraph=True)``; returns self.

        Each call replaces the previous selection; ``compile(False, False)`` restores eager.
        Regions compile lazily on their first real input."""
        settings = None
        if encoders or pools:
            settings = CompileSettings(bool(encoders), bool(pools), backend, dynamic, options, mode)
        self._regions.select(settings)
        return self

    @property
    def compile_settings(self) -> CompileSettings | None:
        return self._regions.settings

    @property
    def last_compiled_regions(self) -> tuple[str, ...]:
        """Regions ("encoder:<node>", "pool:<node>") that ran compiled in the last forward."""
        return tuple(dict.fromkeys(self._regions.ran_compiled))

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()  # type: ignore[no-untyped-call]  # unannotated in torch
        state = dict(state)
        state["_regions"] = RegionRunner()  # copies and pickles never keep compilation
        return state

    # --------------------------------------------------------------------------- outputs
    def output_names(self) -> list[str]:
        branches = [n.name for n in self.schema.root.walk()[1:]]
        return [
            "prediction",
            "root_embedding",
            *(f"branch_embedding:{b}" for b in branches),
            *(f"leaf:{b}" for b in branches),
        ]

    def _parse_outputs(self, outputs: Iterable[str]) -> tuple[str, ...]:
        if isinstance(outputs, str):
            outputs = (outputs,)
        outputs = tuple(dict.fromkeys(outputs))
        valid = self.output_names()
        unknown = [o for o in outputs if o not in valid]
        if unknown:
            raise ValueError(f"unknown output(s) {unknown}; valid outputs are {valid}")
        if not outputs:
            raise ValueError(f"select at least one output from {valid}")
        return outputs

    def _packs(self, name: str) -> bool:
        if self._packing == "off":
            return False
        stack = self.encoders[name]
        return is_stock(stack, STOCK_ENCODER_TYPES) and not has_hooks(stack) and not dropout_active(stack)

    # --------------------------------------------------------------------------- forward
    def output_plan(self, outputs: tuple[str, ...]) -> tuple[set[str], set[str], dict[str, list[str]]]:
        """Nodes to encode, nodes whose pooled vector is needed, and row outputs per node."""
        schema = self.schema
        target = schema.target
        root = schema.root.name
        requested: set[str] = set()  # nodes whose encoding an output needs directly
        want_pool: set[str] = set()
        row_outputs: dict[str, list[str]] = {}
        for out in outputs:
            if out == "prediction":
                requested.add(target.node)
                row_outputs.setdefault(target.node, []).append("target")
            elif out == "root_embedding":
                requested.add(root)
                want_pool.add(root)
            else:
                kind, name = out.split(":", 1)
                requested.add(name)
                if kind == "branch_embedding":
                    want_pool.add(name)
                else:
                    row_outputs.setdefault(name, []).append("leaf")
        encode: set[str] = set()
        for name in requested:
            encode.update(n.name for n in schema.nodes[name].walk())
        want_pool.update(n for n in encode if self._parent.get(n) in encode)
        return encode, want_pool, row_outputs

    def collect_outputs(
        self,
        outputs: tuple[str, ...],
        pooled: dict[str, torch.Tensor],
        rows_out: dict[str, dict[str, torch.Tensor]],
        head: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """The selected outputs from per-node pooled vectors and row outputs (``head``: the
        prediction head to apply, ``self.head`` unless a serving backend brings its own)."""
        target = self.schema.target
        root = self.schema.root.name
        result_dict: dict[str, torch.Tensor] = {}
        for out in outputs:
            if out == "prediction":
                x = rows_out[target.node]["target"]
                if target.node == root:
                    x = x.squeeze(1)
                logits = (self.head if head is None else head)(x)
                result_dict[out] = logits if target.kind == "category" else logits.squeeze(-1)
            elif out == "root_embedding":
                result_dict[out] = pooled[root]
            else:
                kind, name = out.split(":", 1)
                if kind == "branch_embedding":
                    result_dict[out] = pooled[name]
                else:
                    result_dict[out] = rows_out[name]["leaf"]
        return result_dict

    def forward(self, batch: Batch, outputs: Iterable[str] = ("prediction",)) -> dict[str, torch.Tensor]:
        return self.forward_with(batch, outputs, self._encode_rows)

    def forward_with(
        self,
        batch: Batch,
        outputs: Iterable[str],
        encode_rows: EncodeRows,
        head: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """``forward`` with another per-node encoder (and head): the node walk, row checks and
        output selection stay this model's, so a serving backend (tasks/backends/triton)
        replaces only the math. ``encode_rows(node, rows, want_pool, row_outputs)`` returns
        the node's result and the path name it ran ("packed" or "padded")."""
        outputs = self._parse_outputs(outputs)
        schema = self.schema
        encode, want_pool, row_outputs = self.output_plan(outputs)

        self._regions.ran_compiled = []
        paths: dict[str, str] = {}
        pooled: dict[str, torch.Tensor] = {}
        rows_out: dict[str, dict[str, torch.Tensor]] = {}
        for node in reversed(schema.root.walk()):  # children before parents
            if node.name not in encode:
                continue
            result, paths[node.name] = self._encode_node(
                node,
                batch,
                [pooled[c.name] for c in node.children],
                node.name in want_pool,
                tuple(row_outputs.get(node.name, ())),
                encode_rows,
            )
            shape = self._row_shape(node, batch)
            if result.pooled_PD is not None:
                pooled[node.name] = result.pooled_PD.reshape(*shape[:-1], -1)
            rows_out[node.name] = {k: v.reshape(*shape, -1) for k, v in result.rows.items()}
        kinds = set(paths.values())
        self.last_encoder_paths = paths
        self.last_encoder_path = kinds.pop() if len(kinds) == 1 else "mixed"
        return self.collect_outputs(outputs, pooled, rows_out, head)

    def _row_shape(self, node: NodeDef, batch: Batch) -> tuple[int, ...]:
        """``[B, L1..Ld]`` of the node's rows in this batch (each ``Lk`` at most reserved: a
        length-bucketed batch is trimmed to its own longest instances); ``[B, 1]`` for the root."""
        shape = tuple(batch.nodes[node.name].present.shape)
        return shape if len(shape) > 1 else (shape[0], 1)

    def _expected_shape(self, node: NodeDef, batch: Batch) -> tuple[int, ...]:
        """The node's row dims: its parent's rows plus its own length, at most reserved."""
        B = batch.size
        reserved = self.schema.reserved_shape(node.name)
        if not reserved:
            return (B,)
        parent = self._parent[node.name]
        lead = tuple(batch.nodes[parent].present.shape) if parent != self.schema.root.name else (B,)
        own = tuple(batch.nodes[node.name].present.shape)
        L = own[-1] if len(own) == len(reserved) + 1 and 1 <= own[-1] <= reserved[-1] else reserved[-1]
        return (*lead, L)

    def _node_rows(self, node: NodeDef, tensors: NodeTensors, children: list[torch.Tensor], batch: Batch) -> NodeRows:
        shape = self._row_shape(node, batch)
        expected = self._expected_shape(node, batch)
        C, K = len(node.continuous), len(node.categorical)
        X, E = len(node.text), (node.text[0].width if node.text else 0)
        checks: dict[str, tuple[torch.Tensor | None, tuple[int, ...]]] = {
            "present": (tensors.present, expected),
            "continuous": (tensors.continuous, (*expected, C)),
            "continuous_null": (tensors.continuous_null, (*expected, C)),
            "categorical": (tensors.categorical, (*expected, K)),
        }
        if X:
            checks["text"] = (tensors.text, (*expected, X, E))
            checks["text_null"] = (tensors.text_null, (*expected, X))
        for field, (tensor, want) in checks.items():
            got = None if tensor is None else tuple(tensor.shape)
            if got != want:
                raise ValueError(
                    f"batch node {node.name!r}: {field} has shape {got}, the "
                    f"schema expects {want}; encode the batch with the model's schema"
                )
        L = shape[-1]
        P = tensors.present.numel() // L
        present_PL = tensors.present.reshape(P, L)
        # Absent rows may hold anything: make them harmless for the padded path.
        present_PL1 = present_PL.unsqueeze(-1)
        continuous = tensors.continuous.reshape(P, L, C)
        null = tensors.continuous_null.reshape(P, L, C)
        categorical = tensors.categorical.reshape(P, L, K)
        continuous = torch.where(present_PL1 & ~null, continuous, torch.zeros_like(continuous))
        null = null & present_PL1
        categorical = torch.where(present_PL1, categorical, torch.zeros_like(categorical))
        coord = self._coordinates(node.name)
        if torch.compiler.is_compiling() and K:
            # Under a whole-model torch.compile the eager check (a host sync) would break the
            # graph: out-of-range indices map to the column's unknown slot instead, as in export.
            bad = (categorical < 0) | (categorical >= coord.category_cardinality_K)
            categorical = torch.where(bad, torch.full_like(categorical, UNKNOWN_INDEX), categorical)
        else:
            coord.check(categorical)
        children_PLKD = None
        if children:
            children_PLKD = torch.stack([c.reshape(P, L, -1) for c in children], dim=2)
        text = text_null = None
        if X:
            assert tensors.text is not None and tensors.text_null is not None
            text_null = tensors.text_null.reshape(P, L, X) & present_PL1
            text = tensors.text.reshape(P, L, X, E)
            text = torch.where(text_null.unsqueeze(-1) | ~present_PL1.unsqueeze(-1), torch.zeros_like(text), text)
        return NodeRows(present_PL, continuous, null, categorical, children_PLKD, text, text_null)

    def _coordinates(self, name: str) -> CoordinateEncoder:
        encoder = self.coordinates[name]
        assert isinstance(encoder, CoordinateEncoder)
        return encoder

    def _encode_node(
        self,
        node: NodeDef,
        batch: Batch,
        children: list[torch.Tensor],
        want_pool: bool,
        row_outputs: tuple[str, ...],
        encode_rows: EncodeRows,
    ) -> tuple[NodeResult, str]:
        if node.name not in batch.nodes:
            raise ValueError(
                f"batch has no tensors for node {node.name!r} (has {sorted(batch.nodes)}); "
                "encode the batch with the model's schema"
            )
        rows = self._node_rows(node, batch.nodes[node.name], children, batch)
        return encode_rows(node, rows, want_pool, row_outputs)

    def _encode_rows(
        self, node: NodeDef, rows: NodeRows, want_pool: bool, row_outputs: tuple[str, ...]
    ) -> tuple[NodeResult, str]:
        name = node.name
        stack = self._regions.callable_for("encoder", name, self.encoders[name], STOCK_ENCODER_TYPES)
        pool = None
        if want_pool:
            if name in self.pools:
                pool = self._regions.callable_for("pool", name, self.pools[name], STOCK_POOL_TYPES)
            else:
                pool = mean_pool
        packed = self._packs(name)
        run = encode_packed if packed else encode_padded
        result = run(
            rows,
            self.coordinates[name],
            stack,
            pool,
            self.empty[name],
            row_outputs,
            self._coordinates(name).target_index,
        )
        return result, "packed" if packed else "padded"

    # ------------------------------------------------------------------------------ loss
    def loss(self, batch: Batch, outputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean loss over ``label_present`` cells: CE / BCE-with-logits / MSE."""
        if "prediction" not in outputs:
            raise ValueError(
                "loss needs the 'prediction' output; call forward(batch, outputs=('prediction', ...)) first"
            )
        pred = outputs["prediction"]
        keep = batch.label_present
        kind = self.schema.target.kind
        if not bool(keep.any()):
            return pred.sum() * 0.0  # no labelled cell: zero loss, graph kept
        if kind == "category":
            return F.cross_entropy(pred[keep].float(), batch.labels[keep].long())
        if kind == "binary":
            return F.binary_cross_entropy_with_logits(pred[keep].float(), batch.labels[keep].float())
        return F.mse_loss(pred[keep].float(), batch.labels[keep].float())

    def configure_optimizer(self) -> torch.optim.Optimizer:
        """``self.optimizer.build(self)``: the AdamW factory over this model's parameters."""
        return self.optimizer.build(self)
