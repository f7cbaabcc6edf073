"""``model.compile`` semantics, one test per promise of its documentation
(which regions compile, when, with which options, and what stays eager).

Most tests replace ``torch.compile`` with a recorder (no compilation, fast); the tests that
need real Dynamo/Inductor are marked ``slow``.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch

from model import ModelConfig, RelationalTransformer
from model.encoder import EncoderStack
from model.regions import INDUCTOR_DEFAULTS
from model.synthetic import random_batch

ALL = ("prediction", "root_embedding")


class Recorder:
    """Stands in for ``torch.compile``: records calls, returns the function unchanged."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.runs = 0

    def __call__(self, fn, **kwargs):
        self.calls.append(kwargs)

        def run(*args, **kw):
            self.runs += 1
            return fn(*args, **kw)

        return run


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(torch, "compile", rec)
    return rec


def test_compile_is_in_place_returns_self_and_is_lazy(model, recorder):
    assert model.compile() is model
    assert recorder.calls == []  # nothing compiled before real inputs
    model(random_batch(model.schema, 3), outputs=ALL)
    assert len(recorder.calls) == 4  # 3 encoder stacks + 1 attention pool
    assert all(c["fullgraph"] is True for c in recorder.calls)
    model(random_batch(model.schema, 3, seed=1), outputs=ALL)
    assert len(recorder.calls) == 4  # wrappers are reused


@pytest.mark.slow
def test_regions_are_encoder_stacks_and_attention_pools(model, recorder):
    batch = random_batch(model.schema, 3)
    model.compile()
    model(batch, outputs=ALL)
    assert set(model.last_compiled_regions) == {
        "encoder:customer",
        "encoder:orders",
        "encoder:lineitem",
        "pool:lineitem",  # orders and the root use mean pooling: eager, not a region
    }
    model.compile(encoders=True, pools=False)
    model(batch, outputs=ALL)
    assert set(model.last_compiled_regions) == {"encoder:customer", "encoder:orders", "encoder:lineitem"}
    model.compile(encoders=False, pools=True)
    model(batch, outputs=ALL)
    assert set(model.last_compiled_regions) == {"pool:lineitem"}


def test_each_call_replaces_selection_and_false_false_restores_eager(model, recorder):
    batch = random_batch(model.schema, 3)
    model.compile(backend="eager")
    model.compile(encoders=False, pools=False)
    assert model.compile_settings is None
    model(batch, outputs=ALL)
    assert model.last_compiled_regions == () and recorder.calls == []
    model.compile(encoders=False, pools=True, backend="aot_eager", dynamic=True)
    assert model.compile_settings.backend == "aot_eager"
    assert not model.compile_settings.encoders


def test_inductor_defaults_and_user_overrides(model, recorder):
    batch = random_batch(model.schema, 3)
    model.compile(pools=False)
    model(batch, outputs=("root_embedding",))
    opts = recorder.calls[0]["options"]
    assert opts == INDUCTOR_DEFAULTS
    assert opts["fallback_random"] is True and opts["triton.cudagraphs"] is False
    assert opts["comprehensive_padding"] is False and opts["shape_padding"] is False
    assert recorder.calls[0]["backend"] == "inductor" and recorder.calls[0]["dynamic"] is None
    model.compile(pools=False, dynamic=True, options={"shape_padding": True, "max_autotune": True})
    model(batch, outputs=("root_embedding",))
    opts = recorder.calls[-1]["options"]
    assert opts["shape_padding"] is True and opts["max_autotune"] is True
    assert opts["fallback_random"] is True and recorder.calls[-1]["dynamic"] is True
    model.compile(backend="aot_eager")
    model(batch, outputs=("root_embedding",))
    assert recorder.calls[-1]["options"] is None  # inductor options only go to inductor


def test_customized_and_hooked_regions_stay_eager_even_hooks_added_later(model, recorder):
    batch = random_batch(model.schema, 3)
    model.compile()
    model(batch, outputs=ALL)
    handle = model.encoders["orders"].layers[0].attn.register_forward_pre_hook(lambda m, a: None)
    model(batch, outputs=ALL)
    assert "encoder:orders" not in model.last_compiled_regions
    assert "encoder:lineitem" in model.last_compiled_regions
    handle.remove()
    model(batch, outputs=ALL)
    assert "encoder:orders" in model.last_compiled_regions

    class MyStack(EncoderStack):
        pass

    custom = MyStack(16, 2, 2, 0.0, 2)
    custom.load_state_dict(model.encoders["customer"].state_dict())
    model.encoders["customer"] = custom
    model(batch, outputs=ALL)
    assert "encoder:customer" not in model.last_compiled_regions


def test_copies_reloads_and_schema_changes_drop_compilation(model, recorder, make_schema):
    batch = random_batch(model.schema, 3)
    model.compile()
    model(batch, outputs=ALL)
    clone = copy.deepcopy(model)
    assert clone.compile_settings is None
    clone(batch, outputs=ALL)
    assert clone.last_compiled_regions == ()

    fresh = RelationalTransformer(model.schema, model.config)
    fresh.load_state_dict(model.state_dict())
    assert fresh.compile_settings is None
    assert not any("compile" in k or "_regions" in k for k in model.state_dict())

    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)  # state dicts carry no compile state
    model.set_schema(make_schema(line_length=2))
    assert model.compile_settings is None
    model(random_batch(model.schema, 2), outputs=ALL)
    assert model.last_compiled_regions == ()


@pytest.mark.slow
def test_compiler_errors_propagate(model):
    def broken_backend(gm, example_inputs):
        raise RuntimeError("backend exploded")

    torch._dynamo.reset()  # else a region an earlier test compiled is served from Dynamo's cache
    model.compile(backend=broken_backend)
    with pytest.raises(Exception, match="backend exploded"):
        model(random_batch(model.schema, 3), outputs=ALL)


@pytest.mark.slow
def test_real_compile_matches_eager_on_packed_and_padded_paths(schema):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = RelationalTransformer(schema, ModelConfig(d_model=16, heads=2)).eval()
    batch = random_batch(schema, 6, seed=3)
    eager = {p: None for p in ("auto", "off")}
    for packing in eager:
        model.packing = packing
        eager[packing] = model(batch, outputs=ALL)
    model.compile(backend="aot_eager", dynamic=True)
    for packing, ref in eager.items():
        model.packing = packing
        out = model(batch, outputs=ALL)
        assert len(model.last_compiled_regions) == 4
        for k in ALL:
            torch.testing.assert_close(out[k], ref[k], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_inductor_keeps_eager_random_draws(make_schema):
    """Training with dropout: same seed -> same draws compiled and eager (fallback_random)."""
    torch._dynamo.reset()
    schema = make_schema(target_node="customer", target_column="churn")
    torch.manual_seed(0)
    config = ModelConfig(d_model=16, layers=1, heads=2, dropout=0.2, ffn_mult=2)
    model = RelationalTransformer(schema, config).train()
    batch = random_batch(schema, 4, seed=5)
    with torch.no_grad():  # inference graph only: keeps the Inductor build short
        torch.manual_seed(123)
        eager = model(batch, outputs=("leaf:lineitem",))["leaf:lineitem"]
        model.compile(pools=False)  # one region runs: the lineitem encoder stack
        torch.manual_seed(123)
        compiled = model(batch, outputs=("leaf:lineitem",))["leaf:lineitem"]
    assert model.last_compiled_regions == ("encoder:lineitem",)
    assert model.last_encoder_path == "padded"  # active dropout never packs
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
