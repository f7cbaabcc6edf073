"""ONNX export: the flat padded forward equals the model, and one exported file runs any
batch size and padded length within 1e-4 of eager PyTorch on every selected output."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model import RelationalTransformer
from model.batch import Batch, NodeTensors
from model.export import ExportForward, export_onnx, output_name
from model.synthetic import random_batch

ALL = (
    "prediction",
    "root_embedding",
    "branch_embedding:orders",
    "branch_embedding:lineitem",
    "leaf:orders",
    "leaf:lineitem",
)


def trim(batch: Batch, model: RelationalTransformer, lengths: dict[str, int]) -> Batch:
    """The batch padded to shorter per-branch lengths (rows beyond them must be absent)."""
    schema = model.schema
    nodes = {}
    for node in schema.root.walk():
        index = tuple(slice(0, lengths.get(n.name, n.max_length)) for n in schema.path(node.name)[1:])
        t = batch.nodes[node.name]
        nodes[node.name] = NodeTensors(
            *(getattr(t, f)[(slice(None), *index)] for f in ("present", "continuous", "continuous_null", "categorical"))
        )
    return Batch(nodes, batch.labels, batch.label_present)


def short_batch(model: RelationalTransformer, size: int, lengths: dict[str, int], seed: int) -> Batch:
    """A random batch whose present rows fit in ``lengths`` (so trimming loses nothing)."""
    batch = random_batch(model.schema, size, fill=0.6, seed=seed)
    for node in model.schema.root.walk()[1:]:
        keep = torch.ones_like(batch.nodes[node.name].present)
        for depth, level in enumerate(model.schema.path(node.name)[1:], start=1):
            limit = lengths.get(level.name, level.max_length)
            idx = torch.arange(level.max_length).view(*([1] * depth), -1, *([1] * (keep.dim() - depth - 1)))
            keep &= idx < limit
        batch.nodes[node.name].present &= keep
    return batch


def eager(model: RelationalTransformer, batch: Batch, outputs=ALL) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return model(batch, outputs=outputs)


def test_export_forward_matches_the_model(model):
    batch = random_batch(model.schema, 7, seed=1)
    wrapper = ExportForward(model, ALL)
    with torch.no_grad():
        got = wrapper(*wrapper.flat_inputs(batch))
    want = eager(model, batch)  # packed path (packing auto)
    assert model.last_encoder_path == "packed"
    for name, value in zip(ALL, got, strict=True):
        torch.testing.assert_close(value, want[name], atol=1e-5, rtol=1e-5)


def test_export_forward_takes_shorter_padded_lengths(model):
    lengths = {"orders": 2, "lineitem": 2}
    batch = short_batch(model, 9, lengths, seed=2)
    wrapper = ExportForward(model, ALL)
    with torch.no_grad():
        got = dict(zip(ALL, wrapper(*wrapper.flat_inputs(trim(batch, model, lengths))), strict=True))
    want = eager(model, batch)
    torch.testing.assert_close(got["prediction"], want["prediction"][:, :2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got["root_embedding"], want["root_embedding"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got["leaf:lineitem"], want["leaf:lineitem"][:, :2, :2], atol=1e-5, rtol=1e-5)


def test_out_of_range_category_is_masked_to_unknown_not_raised(model):
    batch = random_batch(model.schema, 4, seed=3)
    bad = batch.nodes["lineitem"].categorical.clone()
    bad[0, 0, 0, 0] = 999
    batch.nodes["lineitem"].present[0, 0, 0] = True
    batch.nodes["orders"].present[0, 0] = True
    batch.nodes["lineitem"].categorical = bad
    with pytest.raises(ValueError, match="outside"):
        eager(model, batch)  # the eager model refuses (a host-synced check)
    wrapper = ExportForward(model, ("prediction",))
    with torch.no_grad():
        got = wrapper(*wrapper.flat_inputs(batch))[0]
    batch.nodes["lineitem"].categorical[0, 0, 0, 0] = 1  # the unknown slot
    torch.testing.assert_close(got, eager(model, batch, ("prediction",))["prediction"])


@pytest.mark.slow
def test_one_onnx_file_runs_every_batch_size_and_padded_length(model, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    path = tmp_path / "model.onnx"
    sig = export_onnx(model, ALL, path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    dims = {i.name: i.shape for i in session.get_inputs()}
    assert dims["lineitem.present"] == ["batch", "len_orders", "len_lineitem"]  # symbolic, not baked in
    assert dims["customer.continuous"][0] == "batch"
    names = [output_name(o) for o in ALL]
    wrapper = ExportForward(model, ALL)
    cases = [(1, {}), (7, {}), (256, {}), (7, {"orders": 2, "lineitem": 2}), (256, {"orders": 3, "lineitem": 1})]
    for size, lengths in cases:
        batch = short_batch(model, size, lengths, seed=size)
        want = eager(model, batch)
        feeds = {
            k: v.numpy() for k, v in zip(sig.inputs, wrapper.flat_inputs(trim(batch, model, lengths)), strict=True)
        }
        got = dict(zip(ALL, session.run(names, feeds), strict=True))
        L1, L2 = lengths.get("orders", 4), lengths.get("lineitem", 3)
        crop = {
            "prediction": want["prediction"][:, :L1],
            "leaf:orders": want["leaf:orders"][:, :L1],
            "leaf:lineitem": want["leaf:lineitem"][:, :L1, :L2],
            "branch_embedding:lineitem": want["branch_embedding:lineitem"][:, :L1],
        }
        for name in ALL:
            expected = crop.get(name, want[name]).numpy()
            assert got[name].shape == expected.shape, (size, lengths, name)
            np.testing.assert_allclose(got[name], expected, atol=1e-4, rtol=0, err_msg=f"{size} {lengths} {name}")


def with_text(batch: Batch, model: RelationalTransformer, seed: int) -> Batch:
    """Random text vectors (and some null cells) for every node that has text columns."""
    g = torch.Generator().manual_seed(seed)
    for node in model.schema.root.walk():
        if node.text:
            t = batch.nodes[node.name]
            shape = (*t.present.shape, len(node.text))
            t.text = torch.randn(*shape, node.text[0].width, generator=g)
            t.text_null = torch.rand(shape, generator=g) < 0.2
    return batch


def test_export_forward_feeds_text_columns(small):
    from model import ColumnDef, ModelSchema, NodeDef, TargetDef

    line = NodeDef("lineitem", (ColumnDef("qty", "numeric"), ColumnDef("note", "text", width=5)), max_length=3)
    root = NodeDef(
        "orders",
        (ColumnDef("total", "numeric"), ColumnDef("comment", "text", width=5), ColumnDef("status", "category", 4)),
        children=(line,),
    )
    torch.manual_seed(0)
    model = RelationalTransformer(ModelSchema(root, TargetDef("orders", "status", "category", 3)), small).eval()
    batch = with_text(random_batch(model.schema, 6, seed=4), model, seed=5)
    outputs = ("prediction", "leaf:lineitem")
    wrapper = ExportForward(model, outputs)
    sig = wrapper.signature()
    assert {"orders.text", "orders.text_null", "lineitem.text", "lineitem.text_null"} <= set(sig.inputs)
    with torch.no_grad():
        got = wrapper(*wrapper.flat_inputs(batch))
    want = eager(model, batch, outputs)
    for name, value in zip(outputs, got, strict=True):
        torch.testing.assert_close(value, want[name], atol=1e-5, rtol=1e-5)
    # the text vectors matter: changing one present, non-null cell changes the prediction
    t = batch.nodes["orders"]
    t.text_null[0, 0] = False
    t.text[0, 0] += 3.0
    with torch.no_grad():
        moved = wrapper(*wrapper.flat_inputs(batch))[0]
    assert not torch.allclose(moved[0], got[0][0])
