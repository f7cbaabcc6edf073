"""Checkpoints: weights_only round trip, rebuild from schema+config, optimizer resume rules."""

from __future__ import annotations

import pytest
import torch

from model import adamw
from model.checkpoint import load_checkpoint, save_checkpoint
from model.synthetic import random_batch


def _train_step(model, opt, batch):
    opt.zero_grad()
    model.loss(batch, model(batch)).backward()
    opt.step()


def test_roundtrip_rebuilds_model_and_resumes_optimizer(model, tmp_path, recwarn):
    batch = random_batch(model.schema, 4)
    model.train()
    model.optimizer = adamw(learning_rate=1e-2)
    opt = model.configure_optimizer()
    _train_step(model, opt, batch)
    model.compile(backend="eager")
    path = tmp_path / "ckpt.pt"
    extra = {"vocab": {"segment": ["a", "b"]}, "label_mean": 1.5, "step": 1}
    save_checkpoint(path, model, opt, extra=extra)
    model.compile(encoders=False, pools=False)  # (never ran compiled: keeps the test fast)

    # weights_only loading is what load_checkpoint uses: the payload must allow it
    torch.load(path, weights_only=True)
    ckpt = load_checkpoint(path)
    loaded = ckpt.model
    assert loaded.schema == model.schema and loaded.config == model.config
    assert loaded.compile_settings is None  # compilation is not stored
    assert ckpt.extra == extra
    model.eval(), loaded.eval()
    torch.testing.assert_close(loaded(batch)["prediction"], model(batch)["prediction"])

    resumed = ckpt.resume_optimizer(adamw(learning_rate=1e-2))
    model.train(), loaded.train()
    _train_step(model, opt, batch)
    _train_step(loaded, resumed, batch)
    for (name, a), b in zip(model.named_parameters(), loaded.parameters(), strict=True):
        torch.testing.assert_close(a, b, msg=name)


def test_resume_with_different_settings_is_refused(model, tmp_path):
    opt = adamw(learning_rate=1e-3).build(model)
    save_checkpoint(tmp_path / "c.pt", model, opt, optimizer_settings=adamw(learning_rate=1e-3))
    ckpt = load_checkpoint(tmp_path / "c.pt")
    with pytest.raises(ValueError, match="learning_rate: saved 0.001 != requested 0.01"):
        ckpt.resume_optimizer(adamw(learning_rate=1e-2))
    with pytest.raises(ValueError, match="fused"):
        ckpt.resume_optimizer(adamw(fused=False))
    ckpt.resume_optimizer()  # the saved settings themselves are accepted


def test_checkpoint_without_optimizer_cannot_resume(model, tmp_path):
    save_checkpoint(tmp_path / "m.pt", model)
    with pytest.raises(ValueError, match="no optimizer state"):
        load_checkpoint(tmp_path / "m.pt").resume_optimizer()
