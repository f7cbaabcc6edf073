"""AdamW factory: decay groups, fused default on CPU, settings as plain data."""

from __future__ import annotations

import warnings

import torch

from model import adamw


def test_no_decay_for_biases_1d_and_norm_params(model):
    groups = adamw(weight_decay=0.1).param_groups(model)
    names = {id(p): n for n, p in model.named_parameters()}
    decay = {names[id(p)] for p in groups[0]["params"]}
    keep = {names[id(p)] for p in groups[1]["params"]}
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    assert decay | keep == set(names.values()) and not decay & keep
    assert "encoders.customer.layers.0.attn.qkv.weight" in decay
    assert "coordinates.customer.category_table.weight" in decay
    assert "encoders.customer.layers.0.attn.qkv.bias" in keep
    assert "encoders.customer.norm.weight" in keep
    assert "empty.orders" in keep  # one-dimensional
    assert all("norm" in n or n.endswith("bias") or model.get_parameter(n).ndim <= 1 for n in keep)


def test_fused_default_works_on_cpu_and_steps(model):
    model.optimizer = adamw(learning_rate=1e-2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # fused CPU AdamW exists: no fallback warning
        opt = model.configure_optimizer()
    assert opt.defaults["fused"] is True
    before = model.head.weight.detach().clone()
    model.head.weight.sum().backward()
    opt.step()
    assert not torch.equal(before, model.head.weight)
    assert adamw(fused=False).build(model).defaults["fused"] is False
    assert adamw(fused=None).build(model).defaults["fused"] is None


def test_settings_are_plain_comparable_data():
    a = adamw(learning_rate=1e-3, betas=(0.9, 0.95))
    assert a == adamw(learning_rate=1e-3, betas=[0.9, 0.95])
    assert a.settings() == {
        "learning_rate": 1e-3,
        "weight_decay": 0.01,
        "betas": [0.9, 0.95],
        "eps": 1e-8,
        "fused": True,
    }
