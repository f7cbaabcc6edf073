"""The Triton backend on CPU: its kernels run in Triton's interpreter (``TRITON_INTERPRET=1``)
on CPU tensors and are checked against the PyTorch path.

Tolerances: fp32 kernels (IEEE dots) vs PyTorch fp32 within 1e-5 absolute (seen: ~5e-7);
int8 / fp8 Linears vs ``F.linear`` over the same weights dequantized by ``model/quantize.py``
within 1e-5 (the decode is exact, only the summation order differs); the fp16 compute path
within 2e-2 (inputs rounded to fp16, K <= 40). The e4m3 decode is checked bit for bit on all
256 codes against torch's ``float8_e4m3fn``.

``triton.jit`` picks compiled vs interpreted when a kernel is decorated, and triton's own
lazily imported helpers check ``TRITON_INTERPRET`` again later (triton 3.7.1: ``runtime/jit.py``,
``experimental/gluon/language/_standard.py``), so setting it inside this module and restoring it
after import breaks the second launch. ``tests/conftest.py`` sets it at session start, before
anything can import triton, and ``test_kernels_run_in_the_interpreter`` fails loudly if not.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model import ColumnDef, ModelConfig, ModelSchema, NodeDef, RelationalTransformer, TargetDef
from model.quantize import expand_state, quantize_state, quantize_tensor
from model.synthetic import random_batch
from tasks.backends.triton import kernels
from tasks.backends.triton.backend import TritonBackend
from tasks.backends.triton.kernels import PackedWeight
from tasks.runtime.errors import UserError
from tasks.spec import parse_spec

CPU = torch.device("cpu")


def test_kernels_run_in_the_interpreter():
    assert kernels.interpreted(), "TRITON_INTERPRET=1 must be set before triton is imported (tests/conftest.py)"


def test_fp8_decode_matches_torch_on_every_code():
    codes = torch.arange(256, dtype=torch.uint8)
    got = kernels.decode_fp8(codes)
    want = codes.view(torch.float8_e4m3fn).float()
    assert torch.equal(got.isnan(), want.isnan()) and int(want.isnan().sum()) == 2  # 0x7F, 0xFF
    ok = ~want.isnan()
    assert torch.equal(got[ok], want[ok])  # bit for bit, subnormals and signed zero included
    assert torch.equal(torch.signbit(got[ok]), torch.signbit(want[ok]))


def _weights(kind: str, w: torch.Tensor, b: torch.Tensor) -> tuple[PackedWeight, torch.Tensor]:
    """The packed weight and the PyTorch path's dequantized weight (model/quantize.py)."""
    if kind in ("fp32", "fp16"):
        data = w if kind == "fp32" else w.half()
        return PackedWeight(kind, data, None, b), data.float()
    entry = quantize_tensor(w, kind)
    deq = (entry["q"].float() * entry["scale"][:, None]).reshape(w.shape)
    return PackedWeight(kind, entry["q"], entry["scale"], b), deq


@pytest.mark.parametrize("kind", ["fp32", "int8", "fp8"])
@pytest.mark.parametrize("M, K, N", [(0, 16, 8), (1, 16, 48), (37, 40, 24), (70, 8, 100)])
def test_linear_matches_torch_on_the_dequantized_weight(kind, M, K, N):
    g = torch.Generator().manual_seed(M * 1000 + K + N)
    w, b, x = torch.randn(N, K, generator=g), torch.randn(N, generator=g), torch.randn(M, K, generator=g)
    packed, deq = _weights(kind, w, b)
    got = kernels.linear(x, packed)
    assert got.shape == (M, N) and got.dtype == torch.float32
    torch.testing.assert_close(got, F.linear(x, deq, b), atol=1e-5, rtol=1e-5)
    if kind != "fp32":  # stored as is: 1 byte per weight (+ fp32 scale and bias per channel)
        assert packed.nbytes == N * K + 4 * N + 4 * N
        assert packed.data_NK.dtype == (torch.int8 if kind == "int8" else torch.uint8)


@pytest.mark.parametrize("kind", ["fp16", "fp8"])
def test_linear_fp16_compute(kind):
    g = torch.Generator().manual_seed(3)
    w, b, x = torch.randn(24, 40, generator=g), torch.randn(24, generator=g), torch.randn(19, 40, generator=g)
    packed, deq = _weights(kind, w, b)
    got = kernels.linear(x, packed, torch.float16)
    want = F.linear(x, deq, b)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    assert (got - want).abs().max() > 0  # really computed in fp16, not silently in fp32


def _reference_attention(qkv: torch.Tensor, lengths: list[int], heads: int) -> torch.Tensor:
    out, start = [], 0
    D = qkv.shape[1] // 3
    for n in lengths:
        seg = qkv[start : start + n].view(1, n, 3, heads, D // heads).permute(2, 0, 3, 1, 4)
        out.append(F.scaled_dot_product_attention(seg[0], seg[1], seg[2]).transpose(1, 2).reshape(n, D))
        start += n
    return torch.cat(out) if out else qkv.new_zeros(0, D)


@pytest.mark.parametrize(
    "heads, d_model, lengths",
    [
        (1, 8, [1]),  # a one-token segment
        (2, 16, [3, 1, 1, 9]),
        (3, 24, [5, 70, 2]),  # a segment over several key/query blocks
        (4, 40, [17, 33]),  # head width 10: not a power of two
        (2, 16, []),  # nothing present at all
    ],
)
def test_packed_attention_matches_sdpa_per_segment(heads, d_model, lengths):
    g = torch.Generator().manual_seed(len(lengths) + d_model)
    qkv = torch.randn(sum(lengths), 3 * d_model, generator=g)
    offsets = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    got = kernels.packed_attention(qkv, offsets, max(lengths, default=0), heads)
    assert got.shape == (sum(lengths), d_model)
    torch.testing.assert_close(got, _reference_attention(qkv, lengths, heads), atol=1e-5, rtol=1e-5)


def test_packed_attention_segments_do_not_leak():
    """Changing one segment's keys leaves every other segment's output bit-identical."""
    g = torch.Generator().manual_seed(7)
    lengths = [4, 6, 5]
    qkv = torch.randn(15, 48, generator=g)
    offsets = torch.tensor([0, 4, 10, 15], dtype=torch.int32)
    a = kernels.packed_attention(qkv, offsets, 6, 2)
    qkv[4:10] += 1.0
    b = kernels.packed_attention(qkv, offsets, 6, 2)
    assert torch.equal(a[:4], b[:4]) and torch.equal(a[10:], b[10:]) and not torch.equal(a[4:10], b[4:10])
    del lengths


# --- the backend against the model's own forward -------------------------------------------


def _schema() -> ModelSchema:
    line = NodeDef(
        "lineitem", (ColumnDef("qty", "numeric"), ColumnDef("flag", "category", 4)), max_length=3, reduce="attention"
    )
    orders = NodeDef(
        "orders", (ColumnDef("total", "numeric"), ColumnDef("status", "category", 5)), max_length=3, children=(line,)
    )
    root = NodeDef(
        "customer", (ColumnDef("balance", "numeric"), ColumnDef("segment", "category", 6)), children=(orders,)
    )
    return ModelSchema(root, TargetDef("customer", "segment", "category", 3))


CFG = ModelConfig(d_model=16, layers=1, heads=2, dropout=0.0, ffn_mult=2)


@pytest.fixture(scope="module")
def model() -> RelationalTransformer:
    torch.manual_seed(0)
    return RelationalTransformer(_schema(), CFG).eval()


def _one_row_instances(batch):
    """Every lineitem instance keeps at most its first row (one-row segments)."""
    p = batch.nodes["lineitem"].present
    p[..., 1:] = False
    return batch


@pytest.mark.parametrize(
    "batch_size, fill, shape",
    [
        (1, 1.0, None),  # fully occupied
        (3, 0.4, None),  # mixed occupancy, some empty instances
        (2, {"orders": 1.0, "lineitem": 0.0}, None),  # an empty branch: no lineitem present at all
        (4, 0.0, None),  # nothing below the root
        (3, 0.9, _one_row_instances),
    ],
)
def test_backend_matches_the_model_fp32(model, batch_size, fill, shape):
    batch = random_batch(model.schema, batch_size, fill=fill, seed=batch_size)
    if shape is not None:
        batch = shape(batch)
    outputs = tuple(model.output_names())
    with torch.no_grad():
        want = model(batch, outputs)
    assert model.last_encoder_path == "packed"  # the PyTorch path compared is the packed one
    got = TritonBackend(model, CPU).step(batch, outputs)
    assert set(got) == set(want)
    for k in outputs:
        assert got[k].shape == want[k].shape, k
        torch.testing.assert_close(got[k], want[k], atol=1e-5, rtol=1e-5, msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_backend_keeps_quantized_weights_packed_and_matches(model, fmt):
    payload = quantize_state(model.state_dict(), fmt, "sha")
    expanded = RelationalTransformer(model.schema, CFG).eval()
    expanded.load_state_dict(expand_state(payload))  # the PyTorch path: expanded at load
    backend = TritonBackend(expanded, CPU, fmt, payload)
    fp32_backend = TritonBackend(model, CPU)
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert set(backend.linears) == set(linears)
    packed = {w.data_NK.dtype for w in backend.linears.values()}
    assert packed == {torch.int8 if fmt == "int8" else torch.uint8}
    # 4 -> 1 byte per weight, plus one fp32 scale per output channel
    saved = sum(w.data_NK.numel() * 3 - w.out_features * 4 for w in backend.linears.values())
    assert backend.model_bytes == fp32_backend.model_bytes - saved
    assert backend.tags()["relflow.weights_native"] == "true"
    batch = random_batch(model.schema, 3, fill=0.6, seed=11)
    with torch.no_grad():
        want = expanded(batch, ("prediction", "root_embedding"))
        full = model(batch, ("prediction",))
    got = backend.step(batch, ("prediction", "root_embedding"))
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=1e-5, rtol=1e-5, msg=k)
    assert (got["prediction"] - full["prediction"]).abs().max() < 0.05  # vs fp32 weights: small


def test_backend_refuses_int4_and_customized_regions(model):
    with pytest.raises(ValueError, match="int4"):
        TritonBackend(model, CPU, "int4")
    custom = RelationalTransformer(model.schema, CFG).eval()
    custom.encoders["orders"].register_forward_hook(lambda *a: None)
    with pytest.raises(ValueError, match="customized or hooked"):
        TritonBackend(custom, CPU)


# --- the spec and the before-any-work check ---------------------------------------------------


def _spec(shop_spec, **run):
    shop_spec["run"].update({"backend": "triton", **run})
    return shop_spec


def test_triton_off_cuda_without_interpreter_is_refused_before_work(shop_spec, monkeypatch):
    from tasks.run.backend_setup import check_backend_settings

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    s = parse_spec(_spec(shop_spec, device="cpu"))
    with pytest.raises(UserError) as err:
        check_backend_settings(s)
    text = str(err.value)
    assert err.value.exit_code == 2
    assert "needs a CUDA device" in text and "TRITON_INTERPRET=1" in text and "run.backend pytorch" in text
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    check_backend_settings(s)  # the interpreter: allowed (tests, correctness)


@pytest.mark.parametrize(
    "run, message",
    [
        ({"compile": {"model": True}}, "applies to the PyTorch backend"),
        ({"packing": "off"}, "serves packed attention only"),
    ],
)
def test_triton_spec_mistakes_name_the_key(shop_spec, run, message):
    with pytest.raises(UserError, match=message):
        parse_spec(_spec(shop_spec, **run))


@pytest.mark.slow
def test_start_backend_serves_an_fp8_checkpoint_through_the_engine(shop_spec, shop_files, prepare_chunk, tmp_path):
    """The run's path: fp8 checkpoint -> check_backend -> start_backend -> Engine.predict, with
    the Triton backend's predictions equal to the PyTorch backend's over the same weights."""
    from model.checkpoint import quantize_checkpoint
    from tasks.backends.checkpoint import load_run_checkpoint, save_run_checkpoint
    from tasks.libraries.reference.engine import Engine
    from tasks.measure.clock import Clock
    from tasks.run.backend_setup import BackendPlan, check_backend, start_backend

    spec, enc, schema, tz = prepare_chunk(shop_spec, shop_files)
    engine = Engine(spec, schema, CPU, encoding=enc)
    path = tmp_path / "shop.ckpt"
    save_run_checkpoint(path, engine, enc, spec)
    quantize_checkpoint(path, tmp_path / "shop.fp8.ckpt", "fp8")
    raw = spec.to_dict()
    served = parse_spec({**raw, "run": {**raw["run"], "mode": "predict", "backend": "triton"}})
    got = load_run_checkpoint(tmp_path / "shop.fp8.ckpt", served)
    check_backend(served, got)
    outs = ("prediction",)
    reference = Engine(served, got.schema, CPU, got.model, encoding=got.encoding)
    want = reference.predict(tz, outs).tensors["prediction"]
    engine = Engine(served, got.schema, CPU, got.model, encoding=got.encoding)
    setup, tags = start_backend(served, engine, BackendPlan(), None, got.load, Clock())
    assert tags["relflow.backend"] == "triton" and tags["relflow.weights_format"] == "fp8"
    assert tags["relflow.weights_native"] == "true" and tags["relflow.triton_interpret"] == "true"
    assert 0 < setup.model_bytes < got.load.model_bytes_after_load  # packed, not expanded
    assert setup.metrics()["backend.model_bytes"] == setup.model_bytes
    result = engine.predict(tz, outs)
    assert engine.backend.encoder_path() == "packed"
    torch.testing.assert_close(result.tensors["prediction"], want, atol=1e-5, rtol=1e-5)
    quantize_checkpoint(path, tmp_path / "shop.int4.ckpt", "int4")
    with pytest.raises(UserError, match="int4"):
        check_backend(served, load_run_checkpoint(tmp_path / "shop.int4.ckpt", served))


def test_backends_report_has_triton_variants_skipped_and_said_off_cuda():
    from flows.sweeps.backends_report import VARIANTS, runnable_here

    files = {"fp16": "a.fp16.ckpt", "fp8": "a.fp8.ckpt", "int8": "a.int8.ckpt"}
    assert VARIANTS["triton_fp8"](files) == ["run.backend=triton", "run.precision=fp16", "run.checkpoint=a.fp8.ckpt"]
    assert VARIANTS["triton_int8"](files)[-1] == "run.checkpoint=a.int8.ckpt"
    assert VARIANTS["triton_fp16"](files)[-1] == "run.checkpoint=a.fp16.ckpt"
    said: list[str] = []
    kept = runnable_here(list(VARIANTS), said.append)
    if torch.cuda.is_available():
        assert kept == list(VARIANTS)
    else:
        assert kept == [v for v in VARIANTS if not v.startswith("triton_")]
        assert len(said) == 1 and "triton_fp8" in said[0] and "needs a CUDA device" in said[0]
