"""Packed (length-bucketed dense) and padded (masked) encoder paths agree; path selection."""

from __future__ import annotations

import copy

import pytest
import torch

from model import ModelConfig, RelationalTransformer
from model.encoder import EncoderLayer
from model.synthetic import random_batch

ALL = (
    "prediction",
    "root_embedding",
    "branch_embedding:orders",
    "branch_embedding:lineitem",
    "leaf:orders",
    "leaf:lineitem",
)


def _batch(schema, seed):
    batch = random_batch(schema, 8, fill={"orders": 0.5, "lineitem": 0.6}, null_rate=0.2, seed=seed)
    batch.nodes["orders"].present[0] = False  # an empty branch ...
    batch.nodes["lineitem"].present[0] = False  # ... and the rows under it
    batch.nodes["lineitem"].present[1, 0] = False  # an order without lineitems
    batch.nodes["lineitem"].present[2] = True  # full instances (n = L) ...
    batch.nodes["lineitem"].present[2] &= batch.nodes["orders"].present[2].unsqueeze(-1)
    if batch.label_present.ndim == 2:
        batch.label_present &= batch.nodes["orders"].present
    return batch


@pytest.mark.parametrize(
    ("target", "line_reduce"),
    [(("orders", "status", "category"), "attention"), (("customer", "balance", "regression"), "mean")],
)
def test_packed_equals_padded_forward_and_gradients(make_schema, small, target, line_reduce):
    node, column, kind = target
    schema = make_schema(target_node=node, target_column=column, kind=kind, line_reduce=line_reduce)
    torch.manual_seed(0)
    packed = RelationalTransformer(schema, small).eval()
    padded = copy.deepcopy(packed)
    padded.packing = "off"
    batch = _batch(schema, seed=11)

    out_a = packed(batch, outputs=ALL)
    out_b = padded(batch, outputs=ALL)
    assert packed.last_encoder_path == "packed" and padded.last_encoder_path == "padded"
    for k in ALL:
        assert (out_a[k] - out_b[k]).abs().max().item() <= 1e-5, k

    packed.loss(batch, out_a).backward()
    padded.loss(batch, out_b).backward()
    grads_b = dict(padded.named_parameters())
    for name, p in packed.named_parameters():
        q = grads_b[name]
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            assert torch.isfinite(p.grad).all(), name
            torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_packed_equals_padded_in_train_mode_without_dropout(model):
    model.train()  # dropout=0: training still packs
    batch = _batch(model.schema, seed=12)
    a = model(batch, outputs=ALL)
    assert model.last_encoder_path == "packed"
    model.packing = "off"
    b = model(batch, outputs=ALL)
    for k in ALL:
        assert (a[k] - b[k]).abs().max().item() <= 1e-5, k


def test_active_dropout_runs_padded(schema):
    model = RelationalTransformer(schema, ModelConfig(d_model=16, heads=2, dropout=0.1))
    batch = random_batch(schema, 3)
    model.train()
    model(batch, outputs=ALL)
    assert model.last_encoder_path == "padded"
    model.eval()  # dropout inactive in eval: packs
    model(batch, outputs=ALL)
    assert model.last_encoder_path == "packed"


def test_customized_or_hooked_region_runs_padded(model):
    batch = random_batch(model.schema, 3)

    class MyLayer(EncoderLayer):
        pass

    stack = model.encoders["lineitem"]
    old = stack.layers[0]
    custom = MyLayer(16, 2, 0.0, 2)
    custom.load_state_dict(old.state_dict())
    stack.layers[0] = custom
    model(batch, outputs=ALL)
    assert model.last_encoder_path == "mixed"  # lineitem padded, the others packed
    stack.layers[0] = old
    seen = []
    handle = model.encoders["orders"].layers[1].ffn.register_forward_hook(lambda m, a, o: seen.append(o.shape))
    model(batch, outputs=("branch_embedding:orders",))
    assert model.last_encoder_paths == {"orders": "padded", "lineitem": "packed"}
    assert model.last_encoder_path == "mixed"
    assert seen and seen[0][1] == 4 * 4  # the hook saw the padded L*T tokens
    handle.remove()
    model(batch, outputs=("branch_embedding:orders",))
    assert model.last_encoder_path == "packed"
