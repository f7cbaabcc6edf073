"""The Triton serving backend: the model's predict pass with this project's Triton kernels.

Which parts are Triton (``kernels.py``): every encoder layer's q/k/v, attention-output and
feed-forward Linears, the attention pools' key Linears and the prediction head (packed
weights, decoded inside the kernel), and self-attention over packed present coordinates.
Everything else is PyTorch: the coordinate encoders (value, column and position
embeddings), LayerNorms, GELU, residual adds, the pooling reductions over segments and the
scatter of results back to the batch's ``[P, L]`` rows.

Layout: per node, the present rows of every instance (a prefix of its reserved rows, the
batch contract) are gathered in instance order, so each non-empty instance is one segment
of ``n * T`` consecutive tokens (``offsets`` bound them); empty instances take the learned
empty-branch vector and never reach a kernel. This is the packing the model's own packed
path describes, without its length grouping: one kernel launch per layer covers every
instance of the node whatever its length. The walk over nodes, the row checks and the
output selection are the model's (``RelationalTransformer.forward_with``).

Weights stay in their stored format on the device: fp8 e4m3 codes and int8 values with
fp32 per-output-channel scales, or fp16 / fp32. ``model_bytes`` counts what this backend
serves from: its packed Linears plus the model tensors it borrows (embeddings, norms,
learned vectors), so an fp8 checkpoint shows roughly a quarter of the fp32 bytes for the
Linears.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from model import RelationalTransformer
from model.batch import Batch
from model.encoder import STOCK_ENCODER_TYPES, EncoderLayer, EncoderStack
from model.packing import NodeResult, NodeRows, _row_output
from model.pooling import AttentionPool
from model.regions import has_hooks, is_stock
from model.schema import NodeDef
from tasks.backends.triton import KEPT, check_format, kernels
from tasks.backends.triton.kernels import PackedWeight

COMPUTE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _pack(name: str, linear: nn.Linear, entries: dict[str, Any] | None, device: torch.device) -> PackedWeight:
    """The Linear's weight in the checkpoint's stored format, moved to ``device`` as is."""
    bias = None if linear.bias is None else linear.bias.detach().float().to(device)
    entry = None if entries is None else entries.get(f"{name}.weight")
    kind = "fp32" if entry is None else str(entry["kind"])
    if kind in ("int8", "fp8"):
        assert entry is not None
        q: torch.Tensor = entry["q"]
        scale: torch.Tensor = entry["scale"]
        return PackedWeight(kind, q.to(device).contiguous(), scale.float().to(device), bias)
    if kind == "fp16":
        assert entry is not None
        half: torch.Tensor = entry["data"]
        return PackedWeight("fp16", half.to(device).contiguous(), None, bias)
    return PackedWeight("fp32", linear.weight.detach().float().to(device).contiguous(), None, bias)


class TritonBackend:
    name = "triton"

    def __init__(
        self,
        model: RelationalTransformer,
        device: torch.device,
        weights_format: str = "fp32",
        quantized: dict[str, Any] | None = None,
        precision: str = "fp32",
    ) -> None:
        """``quantized``: the checkpoint's stored payload (``model/quantize.py``), whose int8 /
        fp8 / fp16 Linear weights are kept as stored; without it the model's fp32 weights are
        used. ``precision`` is the kernels' compute dtype (fp32 dots are IEEE, not TF32)."""
        check_format(weights_format)
        if precision not in COMPUTE:
            raise ValueError(f"precision {precision!r} is not one of {tuple(COMPUTE)}")
        if device.type != "cuda" and not kernels.interpreted():
            raise ValueError(
                f"the Triton backend runs compiled kernels on CUDA devices, not {device.type!r}; "
                "set TRITON_INTERPRET=1 before it is imported to run them in Triton's CPU interpreter"
            )
        self.model, self.device, self.weights_format = model, device, weights_format
        self.precision, self.compute_dtype = precision, COMPUTE[precision]
        entries: dict[str, Any] | None = None if quantized is None else quantized["tensors"]
        for node, stack in model.encoders.items():
            # this backend re-implements the stock layers' math; a customized region would be ignored
            if not is_stock(stack, STOCK_ENCODER_TYPES) or has_hooks(stack):
                raise ValueError(
                    f"encoder region {node!r} is customized or hooked; the Triton backend serves "
                    "stock encoder stacks only (use run.backend pytorch)"
                )
        self.linears: dict[str, PackedWeight] = {}
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear) and name.startswith(("encoders.", "pools.", "head")):
                self.linears[name] = _pack(name, module, entries, device)
        served = {id(p) for n, m in model.named_modules() if n in self.linears for p in m.parameters()}
        borrowed = [t for t in (*model.parameters(), *model.buffers()) if id(t) not in served]
        self.model_bytes = sum(w.nbytes for w in self.linears.values()) + sum(
            t.numel() * t.element_size() for t in borrowed
        )
        self.weights_native = all(w.kind == KEPT[weights_format] for w in self.linears.values())

    # ------------------------------------------------------------------------------ serve
    def encoder_path(self) -> str:
        return "packed"

    def session_threads(self) -> int | None:
        return None  # kernels on the device; the host side is torch's

    @torch.no_grad()
    def step(self, batch: Batch, outputs: tuple[str, ...]) -> dict[str, torch.Tensor]:
        return self.model.forward_with(batch, outputs, self._encode_rows, self._head)

    def tags(self) -> dict[str, str]:
        import triton

        return {
            "relflow.backend": self.name,
            "relflow.weights_format": self.weights_format,
            "relflow.weights_native": str(self.weights_native).lower(),
            "relflow.triton_version": str(triton.__version__),
            "relflow.triton_interpret": str(kernels.interpreted()).lower(),
            "relflow.triton_compute_dtype": self.precision,
        }

    # ------------------------------------------------------------------------------- math
    def _linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return kernels.linear(x, self.linears[name], self.compute_dtype)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        return self._linear("head", x)

    def _stack(self, node: str, x_ND: torch.Tensor, offsets_S1: torch.Tensor, max_length: int) -> torch.Tensor:
        stack = self.model.encoders[node]
        assert isinstance(stack, EncoderStack)
        for i, layer in enumerate(stack.layers):
            assert isinstance(layer, EncoderLayer)  # a stock stack (checked at construction)
            p = f"encoders.{node}.layers.{i}"
            qkv = self._linear(f"{p}.attn.qkv", layer.attn_norm(x_ND))
            y = kernels.packed_attention(qkv, offsets_S1, max_length, layer.attn.heads, self.compute_dtype)
            x_ND = x_ND + self._linear(f"{p}.attn.out", y)
            up = layer.ffn.act(self._linear(f"{p}.ffn.up", layer.ffn_norm(x_ND)))
            x_ND = x_ND + self._linear(f"{p}.ffn.down", up)
        normed: torch.Tensor = stack.norm(x_ND)
        return normed

    def _pool(self, node: str, y_ND: torch.Tensor, segment_N: torch.Tensor, S: int) -> torch.Tensor:
        """Per-segment reduction: the node's attention pool (learned query, key Linear in
        Triton, softmax over the segment's tokens) or the mean of its tokens."""
        D = y_ND.shape[-1]
        if node not in self.model.pools:
            total_SD = y_ND.new_zeros(S, D).index_add_(0, segment_N, y_ND)
            count_S = torch.bincount(segment_N, minlength=S).to(y_ND.dtype)
            return total_SD / count_S[:, None]
        pool = self.model.pools[node]
        assert isinstance(pool, AttentionPool)
        score_N = (self._linear(f"pools.{node}.key", y_ND) @ pool.query) * pool.scale
        top_S = score_N.new_full((S,), float("-inf")).scatter_reduce(0, segment_N, score_N, "amax")
        weight_N = torch.exp(score_N - top_S[segment_N])
        weight_N = weight_N / weight_N.new_zeros(S).index_add_(0, segment_N, weight_N)[segment_N]
        return y_ND.new_zeros(S, D).index_add_(0, segment_N, y_ND * weight_N[:, None])

    def _encode_rows(
        self, node: NodeDef, rows: NodeRows, want_pool: bool, row_outputs: tuple[str, ...]
    ) -> tuple[NodeResult, str]:
        name = node.name
        P, L = rows.present_PL.shape
        embed = self.model.coordinates[name]
        empty_D = self.model.empty[name]
        D = empty_D.shape[-1]
        # present rows are a prefix of each instance: their flat ids, instance by instance
        row_R = rows.present_PL.reshape(-1).nonzero().squeeze(1)
        count_P = rows.present_PL.sum(dim=1)
        nonempty_S = (count_P > 0).nonzero().squeeze(1)
        R, S = row_R.numel(), nonempty_S.numel()
        pooled_PD = empty_D.expand(P, D).clone() if want_pool else None
        out = {o: empty_D.new_zeros(P * L, D) for o in row_outputs}
        if R:

            def flat(t: torch.Tensor) -> torch.Tensor:
                return t.reshape(P * L, *t.shape[2:])[row_R]

            def maybe(t: torch.Tensor | None) -> torch.Tensor | None:
                return None if t is None else flat(t)

            x_RTD = embed(
                flat(rows.continuous_PLC),
                flat(rows.continuous_null_PLC),
                flat(rows.categorical_PLK),
                maybe(rows.children_PLKD),
                row_R % L,  # each row's position in its instance
                text_RXE=maybe(rows.text_PLXE),
                text_null_RX=maybe(rows.text_null_PLX),
            )
            T = x_RTD.shape[-2]
            length_S = count_P[nonempty_S] * T
            offsets_S1 = torch.zeros(S + 1, dtype=torch.int32, device=row_R.device)
            offsets_S1[1:] = torch.cumsum(length_S, 0)
            max_length = int(length_S.max())  # host sync: the grid's query-block count
            y_ND = self._stack(name, x_RTD.reshape(R * T, D).float(), offsets_S1, max_length)
            if pooled_PD is not None:
                segment_N = torch.repeat_interleave(torch.arange(S, device=row_R.device), length_S)
                pooled_PD[nonempty_S] = self._pool(name, y_ND, segment_N, S).to(pooled_PD.dtype)
            y_1RTD = y_ND.view(1, R, T, D)
            target_index = self.model._coordinates(name).target_index
            for o in row_outputs:
                out[o][row_R] = _row_output(o, y_1RTD, target_index)[0].to(out[o].dtype)
        return NodeResult(pooled_PD, {o: v.view(P, L, D) for o, v in out.items()}), "packed"
