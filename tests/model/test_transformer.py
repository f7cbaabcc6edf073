"""Forward/loss semantics: shapes, selected outputs, masking, nulls, empty branches."""

from __future__ import annotations

import pytest
import torch

from model import ModelConfig, RelationalTransformer
from model.synthetic import random_batch

ALL = (
    "prediction",
    "root_embedding",
    "branch_embedding:orders",
    "branch_embedding:lineitem",
    "leaf:orders",
    "leaf:lineitem",
)


def test_output_shapes_leaf_target(model):
    batch = random_batch(model.schema, 5, seed=1)
    out = model(batch, outputs=ALL)
    assert out["prediction"].shape == (5, 4, 3)  # leaf target: [B, L1, classes]
    assert out["root_embedding"].shape == (5, 16)
    assert out["branch_embedding:orders"].shape == (5, 16)
    assert out["branch_embedding:lineitem"].shape == (5, 4, 16)
    assert out["leaf:orders"].shape == (5, 4, 16)
    assert out["leaf:lineitem"].shape == (5, 4, 3, 16)
    assert all(torch.isfinite(v).all() for v in out.values())


@pytest.mark.parametrize(
    ("node", "column", "kind", "shape"),
    [
        ("customer", "churn", "category", (6, 3)),
        ("customer", "balance", "binary", (6,)),
        ("customer", "balance", "regression", (6,)),
        ("lineitem", "flag", "category", (6, 4, 3, 3)),
        ("lineitem", "price", "regression", (6, 4, 3)),
    ],
)
def test_prediction_shapes_and_loss(node, column, kind, shape, make_schema, small):
    schema = make_schema(target_node=node, target_column=column, kind=kind)
    model = RelationalTransformer(schema, small)
    batch = random_batch(schema, 6, seed=2)
    out = model(batch)
    assert out["prediction"].shape == shape
    loss = model.loss(batch, out)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_only_selected_outputs_are_computed(model):
    batch = random_batch(model.schema, 4, seed=3)
    calls: list[str] = []
    for name, stack in model.encoders.items():
        stack.register_forward_hook(lambda m, a, o, name=name: calls.append(name))
    out = model(batch, outputs=("prediction",))
    assert set(out) == {"prediction"}
    assert "customer" not in calls  # a leaf-target prediction never encodes the root
    calls.clear()
    out = model(batch, outputs=("branch_embedding:lineitem",))
    assert set(out) == {"branch_embedding:lineitem"} and set(calls) == {"lineitem"}


def test_unknown_output_lists_valid_ones(model):
    batch = random_batch(model.schema, 2)
    with pytest.raises(ValueError, match="valid outputs.*leaf:lineitem"):
        model(batch, outputs=("topk:3",))


def test_label_never_leaks(model):
    """Target placeholders (even NaN) do not change any output."""
    batch = random_batch(model.schema, 4, seed=4)
    a = model(batch, outputs=ALL)
    batch.nodes["orders"].categorical[..., 0] = 4  # overwrite the status placeholder
    b = model(batch, outputs=ALL)
    for k in ALL:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


def test_nan_placeholder_in_continuous_target_gives_finite_grads(make_schema, small):
    schema = make_schema(target_node="lineitem", target_column="price", kind="regression")
    model = RelationalTransformer(schema, small)
    batch = random_batch(schema, 4, seed=5)
    assert torch.isnan(batch.nodes["lineitem"].continuous[..., 1]).all()
    model.loss(batch, model(batch)).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_nulls_are_present_inputs_with_their_own_vector(model):
    batch = random_batch(model.schema, 3, null_rate=0.0, seed=6)
    base = model(batch, outputs=("root_embedding",))["root_embedding"]
    batch.nodes["customer"].continuous_null[0, 0] = True
    batch.nodes["customer"].continuous[0, 0] = 0.0
    out = model(batch, outputs=("root_embedding",))["root_embedding"]
    assert not torch.allclose(out[0], base[0])  # null changed the input ...
    torch.testing.assert_close(out[1:], base[1:])  # ... of that root only
    with torch.no_grad():
        model.coordinates["customer"].continuous_null_CD[0] += 1.0
    moved = model(batch, outputs=("root_embedding",))["root_embedding"]
    assert not torch.allclose(moved[0], out[0])  # ... through the learned null vector


def test_absent_rows_do_not_matter(model):
    batch = random_batch(model.schema, 4, seed=7)
    a = model(batch, outputs=ALL)
    for node in ("orders", "lineitem"):
        t = batch.nodes[node]
        absent = ~t.present
        t.continuous[absent] = 123.0
        t.categorical[absent] = 2
    b = model(batch, outputs=ALL)
    for k in ALL:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


@pytest.mark.parametrize("packing", ["auto", "off"])
def test_empty_branches_are_finite_and_use_empty_vector(model, packing):
    model.packing = packing
    batch = random_batch(model.schema, 4, seed=8)
    for node in ("orders", "lineitem"):
        batch.nodes[node].present[0] = False  # root 0 has no orders at all
    batch.label_present[0] = False
    out = model(batch, outputs=ALL)
    assert all(torch.isfinite(v).all() for v in out.values())
    torch.testing.assert_close(out["branch_embedding:orders"][0], model.empty["orders"])
    model.train()
    model.loss(batch, model(batch, outputs=("prediction", "root_embedding"))).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_all_branches_empty_is_finite(model):
    batch = random_batch(model.schema, 3, fill=0.0, seed=9)
    batch.label_present[:] = False
    out = model(batch, outputs=ALL)
    assert all(torch.isfinite(v).all() for v in out.values())
    loss = model.loss(batch, out)
    assert loss.item() == 0.0


def test_root_rows_are_independent(model):
    batch = random_batch(model.schema, 4, seed=10)
    full = model(batch, outputs=ALL)
    part = model(batch.select(torch.tensor([2, 0])), outputs=ALL)
    for k in ALL:
        torch.testing.assert_close(part[k], full[k][[2, 0]], atol=1e-5, rtol=1e-5)


def test_bad_inputs_raise_value_errors(model, schema, make_schema):
    batch = random_batch(schema, 2)
    batch.nodes["orders"].categorical[0, 0, 0] = 5  # status cardinality is 5 but it is target
    model(batch)  # target placeholder values are ignored, even out of range
    batch.nodes["customer"].categorical[0, 0] = 99
    model(batch)  # the root is not encoded for a leaf-target prediction
    with pytest.raises(ValueError, match="outside"):
        model(batch, outputs=("root_embedding",))
    wrong = random_batch(make_schema(line_length=6), 2)  # longer than reserved (shorter is a trimmed batch)
    with pytest.raises(ValueError, match="lineitem.*shape"):
        model(wrong)
    with pytest.raises(ValueError, match="packing"):
        model.packing = "on"
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig(d_model=10, heads=4)
    with pytest.raises(ValueError, match="prediction"):
        model.loss(batch, {"root_embedding": torch.zeros(2, 16)})


def test_set_schema_keeps_matching_weights(model, make_schema):
    before = model.encoders["customer"].layers[0].attn.qkv.weight.clone()
    model.set_schema(make_schema(line_length=2))
    assert model.coordinates["lineitem"].row_position.weight.shape[0] == 2
    torch.testing.assert_close(model.encoders["customer"].layers[0].attn.qkv.weight, before)
    out = model(random_batch(model.schema, 2), outputs=("prediction",))
    assert out["prediction"].shape == (2, 4, 3)
