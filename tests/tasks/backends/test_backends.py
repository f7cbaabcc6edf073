"""Backends, weight formats and the quality rule, without Prefect: provider errors, spec
checks, load-time expansion and its measurements, the reference-quality rule, bundles."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from model.checkpoint import quantize_checkpoint
from tasks.runtime.errors import UserError
from tasks.spec import parse_spec


def spec_with(shop_spec, **run) -> dict:
    shop_spec["run"].update(run)
    return shop_spec


def test_unavailable_provider_names_the_available_ones():
    from tasks.backends.onnxruntime import check_providers
    from tasks.spec import OnnxRuntime

    with pytest.raises(UserError) as err:
        check_providers(OnnxRuntime(providers=["NoSuchExecutionProvider"]))
    text = str(err.value)
    assert "NoSuchExecutionProvider" in text and "CPUExecutionProvider" in text


def test_provider_error_comes_from_plan_before_any_work(shop_spec, shop_files):
    from flows.benchmark import plan

    s = parse_spec(spec_with(shop_spec, backend="onnxruntime", onnxruntime={"providers": ["CUDAExecutionProvider"]}))
    if "CUDAExecutionProvider" in __import__("onnxruntime").get_available_providers():
        pytest.skip("this onnxruntime build has CUDA")
    with pytest.raises(UserError, match="available here"):
        plan(s, shop_files)


@pytest.mark.parametrize(
    "run, message",
    [
        ({"compile": {"model": True, "encoders": True}}, "compiles the whole model"),
        ({"backend": "onnxruntime", "precision": "bf16"}, "serves the fp32 export"),
        ({"backend": "onnxruntime", "compile": {"model": True}}, "applies to the PyTorch backend"),
        ({"backend": "onnxruntime", "onnxruntime": {"model": "b"}}, "cannot train"),
        ({"max_quality_drop": 0.01}, "needs run.reference_checkpoint"),
        ({"reference_checkpoint": "x.ckpt"}, "needs run.mode predict"),
        ({"onnxruntime": {"graph_optimization_level": "max"}}, "graph_optimization_level"),
    ],
)
def test_backend_spec_mistakes_name_the_key(shop_spec, run, message):
    with pytest.raises(UserError, match=message):
        parse_spec(spec_with(shop_spec, **run))


def test_predict_with_onnxruntime_needs_weights(shop_spec, shop_files):
    from flows.benchmark import plan

    s = parse_spec(spec_with(shop_spec, backend="onnxruntime", mode="predict"))
    with pytest.raises(UserError, match="needs weights to export"):
        plan(s, shop_files)


def test_quality_delta_and_drop_rule():
    from tasks.run.reference_pass import drop_reasons, quality_delta

    acc = quality_delta("accuracy", {"accuracy": 0.80}, {"accuracy": 0.85})
    assert acc["quality.delta_vs_reference"] == pytest.approx(-0.05)
    assert acc["quality.drop_vs_reference"] == pytest.approx(0.05)
    assert acc["quality.reference.accuracy"] == 0.85
    mae = quality_delta("mae", {"mae": 2.5}, {"mae": 2.0})
    assert mae["quality.drop_vs_reference"] == pytest.approx(0.5)  # a larger error is a drop

    class S:  # only run.max_quality_drop is read
        class run:
            max_quality_drop = 0.01

    assert drop_reasons(S, acc) == ["quality drop vs reference 0.0500 > run.max_quality_drop 0.01"]
    assert drop_reasons(S, quality_delta("accuracy", {"accuracy": 0.86}, {"accuracy": 0.85})) == []
    assert "missing" in drop_reasons(S, {})[0]
    # a NaN drop (NaN headline on either side) compared false with the limit, so it passed
    nan = drop_reasons(S, quality_delta("accuracy", {"accuracy": float("nan")}, {"accuracy": 0.85}))
    assert len(nan) == 1 and nan[0].startswith("quality.drop_vs_reference is NaN"), nan
    assert "run.max_quality_drop 0.01 cannot be shown to hold" in nan[0]


@pytest.fixture
def trained_ckpt(shop_spec, shop_files, prepare_chunk, tmp_path):
    """A checkpoint of the shop workload as a run writes it (weights + encoding)."""
    from tasks.backends.checkpoint import save_run_checkpoint
    from tasks.libraries.reference.engine import Engine

    spec, enc, schema, tz = prepare_chunk(shop_spec, shop_files)
    engine = Engine(spec, schema, torch.device("cpu"), encoding=enc)
    engine.train(tz)
    path = tmp_path / "shop.ckpt"
    save_run_checkpoint(path, engine, enc, spec)
    raw = spec.to_dict()
    # Loading for serving is predict mode (train+predict with run.checkpoint resumes training).
    return parse_spec({**raw, "run": {**raw["run"], "mode": "predict"}}), path


@pytest.mark.parametrize("fmt", ["int8", "int4", "fp16", "fp8"])
def test_run_checkpoint_in_any_format_expands_and_reports_its_cost(trained_ckpt, tmp_path, fmt):
    from tasks.backends.checkpoint import load_run_checkpoint

    spec, path = trained_ckpt
    full = load_run_checkpoint(path, spec).load
    q = tmp_path / f"shop.{fmt}.ckpt"
    quantize_checkpoint(path, q, fmt)
    got = load_run_checkpoint(q, spec)
    load = got.load
    assert load.weights_format == fmt and full.weights_format == "fp32"
    assert load.bytes == q.stat().st_size and load.load_seconds > 0
    # expanded at load: the model in memory is the fp32 size whatever the file held
    assert load.model_bytes_after_load == load.model_bytes_fp32 == full.model_bytes_after_load
    assert all(v.dtype == torch.float32 for v in got.model.values() if v.is_floating_point())
    assert got.optimizer is None  # a deployment file: no optimizer state
    m = load.metrics()
    assert set(m) == {
        "checkpoint.bytes",
        "checkpoint.load_seconds",
        "memory.host_after_load_bytes",
        "memory.model_bytes_after_load",
        "memory.model_bytes_fp32",
    }


def test_pytorch_backend_tags_fp8_as_expanded_off_supported_cuda(trained_ckpt, tmp_path):
    from tasks.backends.checkpoint import load_run_checkpoint
    from tasks.libraries.reference.engine import Engine
    from tasks.measure.clock import Clock
    from tasks.run.backend_setup import BackendPlan, start_backend

    spec, path = trained_ckpt
    quantize_checkpoint(path, tmp_path / "s.fp8.ckpt", "fp8")
    got = load_run_checkpoint(tmp_path / "s.fp8.ckpt", spec)
    engine = Engine(spec, got.schema, torch.device("cpu"), got.model, encoding=got.encoding)
    _, tags = start_backend(spec, engine, BackendPlan(), None, got.load, Clock())
    assert tags["relflow.weights_format"] == "fp8"
    assert tags["relflow.weights_native"] == "false"  # CPU: expanded like int8
    quantize_checkpoint(path, tmp_path / "s.int8.ckpt", "int8")
    got = load_run_checkpoint(tmp_path / "s.int8.ckpt", spec)
    engine = Engine(spec, got.schema, torch.device("cpu"), got.model, encoding=got.encoding)
    _, tags = start_backend(spec, engine, BackendPlan(), None, got.load, Clock())
    assert (tags["relflow.weights_format"], tags["relflow.weights_native"]) == ("int8", "false")  # expanded
    _, tags = start_backend(spec, engine, BackendPlan(), None, None, Clock())
    assert (tags["relflow.weights_format"], tags["relflow.weights_native"]) == ("fp32", "true")


def test_native_fp8_is_measured_as_served_and_tagged_native_only_without_fallbacks(
    trained_ckpt, shop_spec, shop_files, prepare_chunk, tmp_path, monkeypatch
):
    """The run's path with native fp8: start_backend swaps Fp8Linear in, the figure is the
    served model's bytes, and predict batches whose row counts are no multiple of 16 are
    counted and take the native tag away. Native fp8 needs CUDA 8.9+; this torch also runs
    ``torch._scaled_mm`` on CPU, so the capability gate (and only it) is opened here."""
    from model.quantize import Fp8Linear
    from tasks.backends.checkpoint import load_run_checkpoint
    from tasks.backends.served import fp8_metrics
    from tasks.libraries.reference.engine import Engine
    from tasks.measure.clock import Clock
    from tasks.run import backend_setup as setup

    spec, path = trained_ckpt
    _, _, _, tz = prepare_chunk(shop_spec, shop_files)
    quantize_checkpoint(path, tmp_path / "s.fp8.ckpt", "fp8")
    got = load_run_checkpoint(tmp_path / "s.fp8.ckpt", spec)
    load = got.load
    assert load.model_bytes_after_load == load.model_bytes_fp32  # expanded, before the backend
    monkeypatch.setattr(setup, "fp8_native_supported", lambda device: True)
    engine = Engine(spec, got.schema, torch.device("cpu"), got.model, encoding=got.encoding)
    _, tags = setup.start_backend(spec, engine, setup.BackendPlan(), None, load, Clock())
    fp8 = [m for m in engine.model.modules() if isinstance(m, Fp8Linear)]
    assert fp8 and tags["relflow.weights_native"] == "true"  # nothing has run yet
    # each swapped weight: 1 byte per value instead of 4, plus its fp32 per-row scales
    saved = sum(3 * m.weight_fp8_t.numel() - 4 * m.out_features for m in fp8)
    assert load.model_bytes_after_load == load.model_bytes_fp32 - saved
    engine.predict(tz, ("prediction",))
    calls = fp8_metrics(engine.model)["backend.fp8_fallback_calls"]
    assert calls == sum(int(m.fallback_calls) for m in fp8) > 0  # packed rows: few multiples of 16
    assert engine.backend.tags()["relflow.weights_native"] == "false"


@pytest.mark.slow
def test_bundle_is_content_hashed_complete_and_checked(trained_ckpt, tmp_path):
    from tasks.backends.bundle import export_bundle, read_bundle

    spec, path = trained_ckpt
    bundle = export_bundle(path, spec, ("prediction",), tmp_path / "bundles")
    files = {p.name for p in bundle.path.iterdir()}
    assert files == {"model.onnx", "config.json", "spec.yaml", "manifest.json"}
    m = json.loads((bundle.path / "manifest.json").read_text())
    assert bundle.path.name == f"shop-{m['bundle_hash'][:16]}"
    assert m["spec_hash"] == spec.spec_hash and m["opset"] >= 18
    assert m["checkpoint_sha256"] == __import__("model.checkpoint", fromlist=["x"]).file_sha256(path)
    assert {"torch_version", "onnx_version", "onnxscript_version"} <= set(m)
    assert read_bundle(bundle.path).content_hash == m["bundle_hash"]
    # a different checkpoint never overwrites: another folder
    other = tmp_path / "other.ckpt"
    quantize_checkpoint(path, other, "int8")
    second = export_bundle(other, spec, ("prediction",), tmp_path / "bundles")
    assert second.path != bundle.path and bundle.path.is_dir()
    assert second.manifest["checkpoint_weights_format"] == "int8"
    # a changed file is caught
    (bundle.path / "spec.yaml").write_text((bundle.path / "spec.yaml").read_text() + "\n# edited\n")
    with pytest.raises(UserError, match="content hash"):
        read_bundle(bundle.path)


def test_not_a_bundle_is_a_user_error(tmp_path: Path):
    from tasks.backends.bundle import read_bundle

    with pytest.raises(UserError, match="not an export bundle"):
        read_bundle(tmp_path)


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        (b"{not json", "manifest.json' is not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "manifest.json' is not valid JSON"),  # RecursionError in json
        (b"[1, 2]", "manifest.json' must hold a JSON object"),
        (b" " * 1_000_001, "over the 1,000,000-byte limit (MAX_BUNDLE_JSON_BYTES)"),
    ],
)
def test_a_damaged_bundle_manifest_is_a_user_error(tmp_path: Path, manifest: bytes, message: str):
    """Issue 24: every JSON the CLI reads is bounded and a damaged one exits 2 (was exit 1)."""
    from tasks.backends.bundle import MODEL_FILE, read_bundle

    for name in (MODEL_FILE, "config.json", "spec.yaml"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "manifest.json").write_bytes(manifest)
    with pytest.raises(UserError, match=re.escape(message)):
        read_bundle(tmp_path)


def test_quantized_checkpoint_cannot_resume_training(trained_ckpt, tmp_path):
    from tasks.backends.checkpoint import load_run_checkpoint

    spec, path = trained_ckpt
    q = tmp_path / "shop.int8.ckpt"
    quantize_checkpoint(path, q, "int8")
    raw = spec.to_dict()
    resume = parse_spec({**raw, "run": {**raw["run"], "mode": "train+predict"}})
    with pytest.raises(UserError, match="no optimizer state"):
        load_run_checkpoint(q, resume)


def test_predict_refuses_a_checkpoint_trained_with_another_validation_fraction(trained_ckpt, tmp_path):
    """Held-out rows of another fraction would include rows the checkpoint trained on: refused
    when the checkpoint loads (plan(), before any work), naming both values and the fix, and
    so is a checkpoint that does not record its split; the format (quantize) keeps the record."""
    from tasks.backends.bundle import export_bundle
    from tasks.backends.checkpoint import load_run_checkpoint

    spec, path = trained_ckpt
    raw = spec.to_dict()
    other = parse_spec({**raw, "task": {**raw["task"], "validation_fraction": 0.5}})
    with pytest.raises(UserError) as err:
        load_run_checkpoint(path, other)
    msg = str(err.value)
    for part in (f"run.checkpoint '{path}'", "task.validation_fraction 0.2", "the spec has 0.5", "=0.2"):
        assert part in msg, (part, msg)
    with pytest.raises(UserError, match="task.validation_fraction 0.2"):
        export_bundle(path, other, ("prediction",), tmp_path / "bundles")
    assert not (tmp_path / "bundles").exists()  # refused before exporting anything
    q = tmp_path / "shop.fp16.ckpt"
    quantize_checkpoint(path, q, "fp16")
    assert load_run_checkpoint(q, spec).load.weights_format == "fp16"  # the record survives
    with pytest.raises(UserError, match="task.validation_fraction 0.2"):
        load_run_checkpoint(q, other)
    # a checkpoint from before the split was recorded cannot be shown to be safe
    from model.checkpoint import load_checkpoint, save_checkpoint

    ckpt = load_checkpoint(path)
    old = tmp_path / "old.ckpt"
    save_checkpoint(old, ckpt.model, extra={k: v for k, v in ckpt.extra.items() if k != "split"})
    with pytest.raises(UserError, match="does not record the train/held-out split"):
        load_run_checkpoint(old, spec)
