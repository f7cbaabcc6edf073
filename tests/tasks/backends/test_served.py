"""The served model's figures: its weights' resident bytes as stored, native fp8 fallbacks."""

from __future__ import annotations

import torch

from model.quantize import expand_state, quantize_state, use_native_fp8
from tasks.backends.served import fp8_metrics, model_bytes, storage_bytes


def _tiny() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 16))  # weight 16 x 32, bias 16


def test_a_storage_counts_once_whatever_views_of_it_are_held():
    w = torch.zeros(16, 32)
    assert storage_bytes([w, w.t(), w[:4]]) == 16 * 32 * 4
    assert storage_bytes([w, torch.zeros(16, 32, dtype=torch.float8_e4m3fn)]) == 16 * 32 * (4 + 1)


def test_native_fp8_weights_count_at_their_stored_size():
    model = _tiny()
    fp32 = 16 * 32 * 4 + 16 * 4  # 2,112 bytes
    assert model_bytes(model) == fp32
    assert use_native_fp8(model, quantize_state(model.state_dict(), "fp8", "sha")) == 1
    # 512 one-byte codes (and their transpose, a view: once), 16 fp32 scales, the fp32 bias
    assert model_bytes(model) == 16 * 32 * 1 + 16 * 4 + 16 * 4  # 640 bytes, 0.303x fp32
    assert fp8_metrics(model) == {"backend.fp8_fallback_calls": 0.0}
    with torch.no_grad():
        model(torch.randn(5, 32))
    assert fp8_metrics(model) == {"backend.fp8_fallback_calls": 1.0}


def test_an_int8_checkpoint_expanded_by_portable_pytorch_holds_fp32_bytes():
    """Portable PyTorch computes from fp32: an int8 load is expanded, and the figure says so."""
    model = _tiny()
    model.load_state_dict(expand_state(quantize_state(model.state_dict(), "int8", "sha")))
    assert model_bytes(model) == 16 * 32 * 4 + 16 * 4
    assert fp8_metrics(model) == {}  # no native fp8 modules: no figure
