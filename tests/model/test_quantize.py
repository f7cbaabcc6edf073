"""Quantized weight formats: exact int4 packing, bounded round-trip error per format, and
checkpoints that load in any format by expanding to fp32."""

from __future__ import annotations

import pytest
import torch

from model.checkpoint import file_sha256, load_checkpoint, quantize_checkpoint, save_checkpoint
from model.quantize import FORMATS, dequantize_tensor, pack_int4, quantize_tensor, unpack_int4
from model.synthetic import random_batch


def test_int4_packs_two_values_per_byte_low_nibble_first():
    q = torch.tensor([[-8, -7, -1, 0, 1, 6, 7, 3]], dtype=torch.int8)
    packed = pack_int4(q)
    # stored as q + 8: (0, 1) -> 0x10, (7, 8) -> 0x87, (9, 14) -> 0xE9, (15, 11) -> 0xBF
    assert packed.dtype == torch.uint8
    assert packed.tolist() == [[0x10, 0x87, 0xE9, 0xBF]]
    assert torch.equal(unpack_int4(packed), q)


def test_int4_round_trip_is_exact_on_representable_values():
    # one group of 32 values already on the grid scale * [-7..7] with max |w| = 7 * 0.5
    grid = torch.tensor([(i % 15) - 7 for i in range(32)], dtype=torch.float32) * 0.5
    w = torch.stack([grid, -grid])
    entry = quantize_tensor(w, "int4")
    assert entry["packed"].shape == (2, 16)  # 32 values -> 16 bytes per row
    assert torch.equal(dequantize_tensor(entry), w)


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_error_is_within_the_format_step(fmt):
    torch.manual_seed(0)
    w = torch.randn(24, 70)
    w[3] = 0.0  # an all-zero row round-trips exactly
    back = dequantize_tensor(quantize_tensor(w, fmt))
    assert back.dtype == torch.float32 and back.shape == w.shape
    assert torch.equal(back[3], w[3])
    amax = w.abs().amax(dim=1, keepdim=True)
    err = (back - w).abs()
    if fmt == "fp16":
        assert err.max() <= 1e-3
    elif fmt == "int8":
        assert (err <= amax / 127 / 2 + 1e-6).all()
    elif fmt == "int4":  # per group of 32 along the row; the group max bounds the row max
        assert (err <= amax / 7 / 2 + 1e-6).all()
    else:  # e4m3 has 3 mantissa bits: relative step 2**-3 at worst, half of it in rounding
        assert (err <= w.abs() * 2**-4 + amax / 448 * 2**-9 + 1e-7).all()


def test_one_dimensional_and_integer_tensors_are_kept():
    bias = torch.randn(5)
    idx = torch.arange(4)
    assert torch.equal(dequantize_tensor(quantize_tensor(bias, "int8")), bias)
    assert torch.equal(dequantize_tensor(quantize_tensor(idx, "int4")), idx)


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantized_checkpoint_loads_expanded_to_fp32(model, tmp_path, fmt):
    src = tmp_path / "model.ckpt"
    save_checkpoint(src, model, extra={"note": "x"})
    info = quantize_checkpoint(src, tmp_path / f"model.{fmt}.ckpt", fmt)
    assert info["source_sha256"] == file_sha256(src)
    ckpt = load_checkpoint(tmp_path / f"model.{fmt}.ckpt")
    assert ckpt.weights_format == fmt and ckpt.source_sha256 == info["source_sha256"]
    assert ckpt.extra == {"note": "x"} and ckpt.optimizer_state is None
    state = ckpt.model.state_dict()
    assert all(v.dtype == torch.float32 for v in state.values() if v.is_floating_point())
    # load-time expansion: same in-memory size as the fp32 model
    assert sum(v.numel() * v.element_size() for v in state.values()) == sum(
        v.numel() * v.element_size() for v in model.state_dict().values()
    )
    batch = random_batch(model.schema, 6, seed=4)
    with torch.no_grad():
        want = model(batch)["prediction"]
        got = ckpt.model.eval()(batch)["prediction"]
    tol = {"fp16": 1e-2, "int8": 5e-2, "fp8": 0.2, "int4": 0.5}[fmt]
    assert (got - want).abs().max() < tol


def test_integer_files_are_smaller_than_fp32(model, tmp_path):
    # At the default width (tiny test models are dominated by per-tensor file overhead).
    from model import ModelConfig, RelationalTransformer

    wide = RelationalTransformer(model.schema, ModelConfig(d_model=64, layers=2, heads=4))
    src = tmp_path / "model.ckpt"
    save_checkpoint(src, wide)
    sizes = {fmt: quantize_checkpoint(src, tmp_path / f"m.{fmt}.ckpt", fmt)["bytes"] for fmt in FORMATS}
    fp32 = src.stat().st_size
    assert sizes["fp16"] < fp32 and sizes["int8"] < sizes["fp16"] and sizes["int4"] < sizes["int8"]


def test_quantizing_a_quantized_checkpoint_is_refused(model, tmp_path):
    src = tmp_path / "model.ckpt"
    save_checkpoint(src, model)
    quantize_checkpoint(src, tmp_path / "m.int8.ckpt", "int8")
    with pytest.raises(ValueError, match="already a int8"):
        quantize_checkpoint(tmp_path / "m.int8.ckpt", tmp_path / "again.ckpt", "int4")


CUDA_FP8 = torch.cuda.is_available() and __import__("model.quantize", fromlist=["x"]).fp8_native_supported(
    torch.device("cuda")
)


@pytest.mark.skipif(not CUDA_FP8, reason="native fp8 needs CUDA compute capability 8.9+")
def test_fp8_stays_native_on_supported_cuda(model, tmp_path):
    from model import ModelConfig, RelationalTransformer
    from model.quantize import Fp8Linear, use_native_fp8

    torch.manual_seed(0)
    wide = RelationalTransformer(model.schema, ModelConfig(d_model=64, layers=2, heads=4)).eval()
    save_checkpoint(tmp_path / "m.ckpt", wide)
    quantize_checkpoint(tmp_path / "m.ckpt", tmp_path / "m.fp8.ckpt", "fp8")
    expanded = load_checkpoint(tmp_path / "m.fp8.ckpt", map_location="cuda")
    native = load_checkpoint(tmp_path / "m.fp8.ckpt", map_location="cuda")
    swapped = use_native_fp8(native.model, native.quantized_weights)
    fp8 = [m for m in native.model.modules() if isinstance(m, Fp8Linear)]
    assert swapped == len(fp8) > 0
    assert all(m.weight_fp8_t.dtype == torch.float8_e4m3fn for m in fp8)
    batch = random_batch(model.schema, 64, fill=1.0, seed=5, device="cuda")
    with torch.no_grad():
        want = expanded.model.eval()(batch)["prediction"]
        got = native.model.eval()(batch)["prediction"]
    assert native.model.last_encoder_path == "packed"  # Fp8Linear counts as a stock layer
    assert (got - want).abs().max() < 0.1 * want.abs().max() + 1e-3


def _fp8_linear(in_features: int, out_features: int):
    from model.quantize import Fp8Linear

    torch.manual_seed(0)
    entry = quantize_tensor(torch.randn(out_features, in_features), "fp8")
    return Fp8Linear(entry["q"], entry["scale"], torch.zeros(out_features))


def test_fp8_linear_counts_the_calls_that_dequantize_the_weight():
    """The fallback's count, on hand-made row counts: 16 and 32 rows take the fp8 kernel
    (``torch._scaled_mm``; this torch also runs it on CPU), 5 and 17 rows dequantize."""
    layer = _fp8_linear(32, 16)
    with torch.no_grad():
        for rows in (16, 5, 32, 17):
            layer(torch.randn(rows, 32))
        assert int(layer.fallback_calls) == 2
        layer(torch.randn(3, 7, 32))  # 21 rows once flattened: a fallback
    assert int(layer.fallback_calls) == 3
    narrow = _fp8_linear(24, 16)  # in_features 24 is no multiple of 16: every call falls back
    with torch.no_grad():
        narrow(torch.randn(16, 24))
    assert int(narrow.fallback_calls) == 1
    assert "fallback_calls" not in layer.state_dict()  # run state, never in a checkpoint


def test_fp8_fallback_calls_sums_a_models_fp8_linears_and_is_none_without_them():
    from model.quantize import fp8_fallback_calls

    model = torch.nn.Sequential(_fp8_linear(32, 32), torch.nn.ReLU(), _fp8_linear(32, 16))
    with torch.no_grad():
        model(torch.randn(5, 32))  # both layers fall back
        model(torch.randn(16, 32))  # neither does
    assert fp8_fallback_calls(model) == 2
    assert fp8_fallback_calls(torch.nn.Sequential(torch.nn.Linear(32, 16))) is None
