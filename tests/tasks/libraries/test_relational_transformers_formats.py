"""fp8/int8/int4 RT weights are relational-transformers-utils' files (issue 41 item 2).

``RTDriver.save`` hands the fp32 file to ``relational_transformers_utils.quantization``'s
``quantize_checkpoint`` instead of the quantizer this project used to carry. Each test pins a
way their files differ from ours (README, "Their quantizer, not ours"), checked against the
formula written out here, so each fails if the difference goes away or changes:

- fp8: unscaled e4m3 (ours stored a per-row ``q_scale``); a [d, 1] encoder matrix loses up to
  1/16 of its values where a per-row scale kept them exact;
- every tensor that is not a 2-D ``*.weight`` stays fp32 (ours wrote fp16);
- int8: the same per-row symmetric codes and fp32 scales as ours, bit for bit;
- int4: the same nibble order (column 2j low, 2j+1 high) and fp16 ``(scale, minimum)`` pairs,
  but the codes are rounded against the fp32 scale and minimum, not the fp16 ones stored, so
  a value can land more than half a step from its weight after loading;
- int4 leaves a matrix whose width is not a multiple of 32 in fp32 (ours: fp16): at d 48 the
  int4 file is larger than the int8 one;
- the file carries ``quantization`` metadata, and ``rt-quantize``'s folders record it in their
  config: the quantize command refuses such a folder as a source (it took it for fp32);
- ``quantize_checkpoint`` refuses a ``.pt`` weight file; the driver hands it the fp32
  safetensors it writes, so a ``.pt`` checkpoint still quantizes.

And theirs loads wherever ours did: the driver's load path, an ONNX export of the loaded model.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"

from relational_transformers_utils import quantization as rtu  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from tasks.libraries.relational_transformers import RTDriver, build_contexts, collate, encode, fit_stats  # noqa: E402
from tasks.libraries.relational_transformers.formats import source_format  # noqa: E402
from tasks.spec import Spec, parse_spec  # noqa: E402
from tasks.stages.preprocess import preprocess  # noqa: E402
from tasks.stages.retrieve import ROOT, Retrieved  # noqa: E402

E4M3_MAX = 448.0


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def binary_shop(shop_spec: dict[str, Any], shop_tables: dict[str, pa.Table], d_model: int) -> tuple[Spec, pa.Table]:
    raw = copy.deepcopy(shop_spec)
    raw["task"] = {"target": "churn", "kind": "binary"}
    raw["model"] = {"d_model": d_model, "layers": 2, "heads": 4}
    c = shop_tables["customers"]
    churn = pa.array([v == "yes" for v in c.column("churn").to_pylist()], pa.bool_())
    c = c.set_column(c.schema.get_field_index("churn"), "churn", churn)
    spec = parse_spec(raw, "(test)")
    tables = {ROOT: c, "orders": shop_tables["orders"], "lines": shop_tables["lines"]}
    return spec, preprocess(spec, Retrieved(tables, bytes_read=0, root_rows=c.num_rows)).table


def saved(shop_spec, shop_tables, tmp_path: Path, d_model: int = 64, formats=("fp8", "int8", "int4")):
    """A fresh driver (seeded), its fp32 state, and each format's folder."""
    spec, table = binary_shop(shop_spec, shop_tables, d_model)
    driver = RTDriver.from_spec(spec, fit_stats(table, spec))
    state = {k: v.detach().clone() for k, v in driver.model.state_dict().items()}
    folders = {fmt: driver.save(tmp_path / fmt, fmt) for fmt in ("fp32", *formats)}
    return spec, table, driver, state, folders


def tensors(folder: Path, file: str = "model.safetensors") -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    path = folder / file
    with safe_open(str(path), framework="pt") as handle:
        meta = handle.metadata() or {}
    return load_file(str(path)), meta


def same_file(a: Path, b: Path) -> bool:
    """The same tensors (names, dtypes, bits) and metadata (safetensors writes the metadata
    map in no fixed order, so the bytes of two equal files can differ)."""
    ta, ma = tensors(a.parent, a.name)
    tb, mb = tensors(b.parent, b.name)
    return (
        ma == mb
        and set(ta) == set(tb)
        and all(
            ta[n].dtype == tb[n].dtype and torch.equal(ta[n].view(torch.uint8), tb[n].view(torch.uint8)) for n in ta
        )
    )


def is_matrix(name: str, t: torch.Tensor) -> bool:
    return name.endswith(".weight") and t.ndim == 2 and t.is_floating_point()


def test_fp8_is_unscaled_e4m3_of_the_matrices_every_other_tensor_fp32(shop_spec, shop_tables, tmp_path):
    spec, _, _, state, folders = saved(shop_spec, shop_tables, tmp_path, formats=("fp8",))
    stored, meta = tensors(folders["fp8"].directory)
    assert meta == {"format": "pt", "quantization": "fp8_e4m3fn"}  # ours wrote no metadata
    assert set(stored) == set(state)  # no <name>.q_scale (ours: one per matrix)
    matrices = [n for n, t in state.items() if is_matrix(n, t)]
    assert folders["fp8"].quantized_tensors == len(matrices) == 45
    for name, w in state.items():
        if name in matrices:
            assert stored[name].dtype == torch.float8_e4m3fn
            expected = w.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
            assert torch.equal(stored[name].view(torch.uint8), expected.view(torch.uint8)), name
        else:  # ours: fp16
            assert stored[name].dtype == w.dtype == torch.float32 and torch.equal(stored[name], w), name

    # no scale: e4m3's 3 mantissa bits apply to the weight itself. A [d, 1] encoder row holds
    # one value, which a per-row scale maps to 448 exactly (ours: error 0); theirs rounds it.
    w = state["enc_dict.number.weight"]
    assert w.shape == (64, 1)
    loaded = RTDriver.from_spec(spec, checkpoint=folders["fp8"].directory)
    got = loaded.model.state_dict()["enc_dict.number.weight"]
    assert torch.equal(got, w.to(torch.float8_e4m3fn).float())
    row_scale = w.abs().amax(1, keepdim=True) / E4M3_MAX
    assert float(((w / row_scale).to(torch.float8_e4m3fn).float() * row_scale - w).abs().max()) < 1e-6
    worst = float((got - w).abs().max())
    assert worst > 0.01 and worst <= float(w.abs().max()) / 16  # half a step of 3 mantissa bits
    # weights below e4m3's smallest normal (2**-6) keep fewer bits; below 2**-10 they are lost
    flushed = sum(int(((stored[n].float() == 0) & (state[n] != 0)).sum()) for n in matrices)
    tiny = sum(int(((state[n].abs() <= 2**-10) & (state[n] != 0)).sum()) for n in matrices)
    assert flushed == tiny and flushed > 0


def test_int8_codes_and_scales_are_the_rowwise_formula_other_tensors_fp32(shop_spec, shop_tables, tmp_path):
    _, _, _, state, folders = saved(shop_spec, shop_tables, tmp_path, formats=("int8",))
    stored, meta = tensors(folders["int8"].directory)
    assert meta == {"format": "pt", "quantization": "int8_rowwise"}
    matrices = [n for n, t in state.items() if is_matrix(n, t)]
    assert set(stored) == set(state) | {f"{n}.q_scale" for n in matrices}  # the names ours wrote
    for name, w in state.items():
        if name in matrices:  # identical to ours, bit for bit
            scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0
            codes = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
            assert stored[f"{name}.q_scale"].dtype == torch.float32 and torch.equal(stored[f"{name}.q_scale"], scale)
            assert torch.equal(stored[name], codes), name
        else:  # ours: fp16
            assert stored[name].dtype == torch.float32 and torch.equal(stored[name], w), name
    config = json.loads((folders["int8"].directory / "config.json").read_text())
    assert config["weight_format"] == "int8"
    assert config["quantization"] == {"format": "int8_rowwise", "matrix_weights_only": True}


def test_int4_nibble_order_and_pairs_as_ours_codes_against_fp32_parameters(shop_spec, shop_tables, tmp_path):
    _, _, _, state, folders = saved(shop_spec, shop_tables, tmp_path, formats=("int4",))
    stored, meta = tensors(folders["int4"].directory)
    assert meta == {"format": "pt", "quantization": "int4_g32"}
    matrices = [n for n, t in state.items() if is_matrix(n, t) and t.shape[1] % 32 == 0]
    assert folders["int4"].quantized_tensors == len(matrices) == 42  # the [64, 1] encoders stay
    assert set(stored) == set(state) | {f"{n}.q4_scale" for n in matrices}
    beyond_half_a_step = 0
    moved_codes = 0
    for name in matrices:
        w = state[name]
        rows, cols = w.shape
        groups = w.reshape(rows, cols // 32, 32)
        minimum = groups.amin(-1)
        scale = (groups.amax(-1) - minimum).clamp_min(1e-12) / 15.0
        codes = torch.round((groups - minimum[..., None]) / scale[..., None]).clamp(0, 15).to(torch.uint8)
        codes = codes.reshape(rows, cols)
        packed, pairs = stored[name], stored[f"{name}.q4_scale"]
        assert packed.dtype == torch.uint8 and packed.shape == (rows, cols // 2)
        assert torch.equal(packed, codes[:, 0::2] | (codes[:, 1::2] << 4)), name  # 2j low, 2j+1 high
        assert pairs.dtype == torch.float16 and pairs.shape == (rows, 2 * (cols // 32))
        assert torch.equal(pairs, torch.stack([scale, minimum], -1).reshape(rows, -1).half()), name
        # ours rounded the pair to fp16 first and coded against it; the codes against the
        # stored pair are what the loader's arithmetic would want
        s16, m16 = pairs.float().reshape(rows, -1, 2).unbind(-1)
        ours = torch.round((groups - m16[..., None]) / s16[..., None]).clamp(0, 15).to(torch.uint8).reshape(rows, cols)
        moved_codes += int((ours != codes).sum())
        loaded = (codes.float().reshape(rows, -1, 32) * s16[..., None] + m16[..., None]).reshape(rows, cols)
        beyond_half_a_step += int(((loaded - w).abs().reshape(rows, -1, 32) > s16[..., None] * 0.5 * (1 + 1e-3)).sum())
    assert moved_codes > 0 and beyond_half_a_step > 0
    for name, w in state.items():
        if name not in matrices:  # ours: fp16
            assert stored[name].dtype == w.dtype and torch.equal(stored[name], w), name


def test_int4_leaves_widths_off_32_in_fp32_so_the_file_outgrows_int8(shop_spec, shop_tables, tmp_path):
    spec, table, driver, state, folders = saved(shop_spec, shop_tables, tmp_path, d_model=48)
    stored, _ = tensors(folders["int4"].directory)
    matrices = [n for n, t in state.items() if is_matrix(n, t)]
    off = [n for n in matrices if state[n].shape[1] % 32]
    assert len(matrices) == 45 and len(off) == 41  # every [*, 48] matrix: all but ffn.w2 and the text encoders
    for name in off:
        assert stored[name].dtype == torch.float32 and torch.equal(stored[name], state[name])  # ours: fp16
    assert folders["int4"].quantized_tensors == 4
    size = {f: c.weight_file_bytes for f, c in folders.items()}
    assert size["int8"] < size["int4"] < size["fp32"]  # at d 64: int4 < int8
    # behaviour stays correct: it loads, every weight as written
    contexts = build_contexts(table, spec, driver.stats)
    batch = collate(contexts, encode(contexts), np.arange(contexts.count))
    loaded = RTDriver.from_spec(spec, checkpoint=folders["int4"].directory)
    for name in off:
        assert torch.equal(loaded.model.state_dict()[name], state[name])
    assert float((loaded.predict(batch) - driver.predict(batch)).abs().max()) < 0.05


def test_an_rt_quantize_folder_is_byte_for_byte_ours_and_refused_as_a_source(shop_spec, shop_tables, tmp_path):
    from typer.testing import CliRunner

    from flows.cli.app import app

    spec, table, driver, _, folders = saved(shop_spec, shop_tables, tmp_path)
    for fmt in ("fp8", "int8", "int4"):  # rt-quantize's own entry point over our fp32 folder
        out = rtu.quantize_model(folders["fp32"].directory, tmp_path / f"rtq-{fmt}", fmt=fmt, tasks=("classification",))
        assert same_file(
            out / "classification" / f"model.{fmt}.safetensors", folders[fmt].directory / "model.safetensors"
        )
        # their folder: a task subfolder, model.<fmt>.safetensors, our config copied, its
        # weight_format "fp32" included (read first, it made the folder a source to quantize again)
        config = json.loads((out / "classification" / "config.json").read_text())
        assert config["weight_format"] == "fp32" and config["checkpoint_file"] == f"model.{fmt}.safetensors"
        assert source_format(out) == {"fp8": "fp8_e4m3fn", "int8": "int8_rowwise", "int4": "int4_g32"}[fmt]
        loaded = RTDriver.from_spec(spec, driver.stats, checkpoint=out)  # the library resolves the subfolder
        contexts = build_contexts(table, spec, driver.stats)
        batch = collate(contexts, encode(contexts), np.arange(contexts.count))
        ours = RTDriver.from_spec(spec, checkpoint=folders[fmt].directory)
        assert torch.equal(loaded.predict(batch), ours.predict(batch))
    # a bare quantize_checkpoint file (no quantization in the config): read from its metadata
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"num_blocks": 2, "checkpoint_file": "model.safetensors"}))
    rtu.quantize_checkpoint(folders["fp32"].directory / "model.safetensors", bare / "model.safetensors", fmt="int4")
    assert source_format(bare) == "int4_g32"
    assert source_format(folders["fp32"].directory) == "fp32"
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(
        json.dumps({**spec.to_dict(), "model": {**spec.to_dict()["model"], "library": "relational_transformers"}})
    )
    res = CliRunner().invoke(app, ["quantize", str(tmp_path / "rtq-int8"), "--spec", str(spec_file)])
    assert res.exit_code == 2 and "holds int8_rowwise weights" in " ".join(res.output.split()), res.output


def test_a_pt_weight_file_still_quantizes_though_quantize_checkpoint_refuses_it(shop_spec, shop_tables, tmp_path):
    spec, table, driver, state, folders = saved(shop_spec, shop_tables, tmp_path, formats=())
    pt = tmp_path / "pt"
    pt.mkdir()
    torch.save(state, pt / "model.pt")
    config = json.loads((folders["fp32"].directory / "config.json").read_text())
    (pt / "config.json").write_text(json.dumps({**config, "checkpoint_file": "model.pt"}))
    (pt / "relflow_stats.json").write_text(driver.stats.to_json())
    with pytest.raises(ValueError, match="requires a safetensors checkpoint"):
        rtu.quantize_checkpoint(pt / "model.pt", tmp_path / "x.safetensors", fmt="int8")
    from_pt = RTDriver.from_spec(spec, checkpoint=pt)
    int8 = from_pt.save(tmp_path / "from-pt", "int8")
    ref = driver.save(tmp_path / "from-fp32", "int8")
    assert same_file(int8.directory / "model.safetensors", ref.directory / "model.safetensors")
    assert not list(int8.directory.glob("*.fp32.*"))  # the intermediate fp32 file is gone


@pytest.mark.slow  # three exports (about 15 s here)
def test_their_files_load_through_the_driver_and_its_onnx_export(shop_spec, shop_tables, tmp_path):
    spec, table, driver, state, folders = saved(shop_spec, shop_tables, tmp_path)
    contexts = build_contexts(table, spec, driver.stats)
    batch = collate(contexts, encode(contexts), np.arange(contexts.count))
    reference = driver.predict(batch)
    for fmt in ("fp8", "int8", "int4"):
        loaded = RTDriver.from_spec(spec, checkpoint=folders[fmt].directory)
        assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}
        p = loaded.predict(batch)
        assert 0 < float((p - reference).abs().max()) < 0.05
        onnx = loaded.onnx(loaded.export_onnx(tmp_path / f"{fmt}.onnx", batch), intra_op_threads=1)
        assert float((onnx.predict(batch) - p).abs().max()) < 1e-5
