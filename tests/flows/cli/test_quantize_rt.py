"""``relflow-bench quantize`` on a relational-transformers checkpoint folder (issue 34 item 4):
fp16/fp8/int8/int4 folders in the library's loader layout, each loaded in a fresh process, the
task metrics of the held-out rows against the fp16 file.

The figures the command prints are checked against values computed here independently: every
format loaded in this process and its held-out rows predicted batch by batch, the MAE and the
largest output difference from fp16 computed with NumPy; the weight files' sizes read from
disk. A regression target, so every format's metric differs from fp16's by a real amount.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _regression_spec(shop_spec: dict[str, Any]) -> dict[str, Any]:
    spec = copy.deepcopy(shop_spec)
    del spec["schema"]["root"]["columns"]["c_balance"]  # the target is not an input
    spec["task"] = {"target": "c_balance", "kind": "regression", "validation_fraction": 0.6}
    # d 32: int4 packs groups of 32 inputs; two blocks reach the lines two hops down
    spec["model"] = {"library": "relational_transformers", "d_model": 32, "layers": 2, "heads": 4}
    return spec


def _table(rows: list[str]) -> dict[str, dict[str, float]]:
    """A printed markdown table -> {first cell: {header: float}}."""
    head = [c.strip() for c in rows[0].strip("|").split("|")]
    out = {}
    for line in rows[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        out[cells[0]] = {h: float(c) for h, c in zip(head[1:], cells[1:], strict=True)}
    return out


@pytest.mark.slow  # five fresh processes (about a minute here)
def test_quantize_writes_every_format_and_reports_metrics_against_fp16(shop_spec, shop_files, tmp_path):
    import torch

    from flows.cli.app import app
    from tasks.libraries.relational_transformers import RTDriver, build_contexts, collate, encode, fit_stats
    from tasks.sources.files import resolve_sources
    from tasks.spec import parse_spec
    from tasks.stages.preprocess import preprocess
    from tasks.stages.retrieve import list_root_keys, retrieve

    raw = _regression_spec(shop_spec)
    spec_file = shop_files / "shop_rt.yaml"
    spec_file.write_text(yaml.safe_dump(raw))
    spec = parse_spec(raw, "(test)")
    sources = resolve_sources(spec, shop_files)
    keys, _ = list_root_keys(spec, sources)
    table = preprocess(spec, retrieve(spec, sources, keys)).table
    stats = fit_stats(table, spec)
    source = tmp_path / "ck" / "shop.ckpt"
    torch.manual_seed(0)
    RTDriver.from_spec(spec, stats).save(source)  # fp32, the run's layout

    res = CliRunner().invoke(app, ["quantize", str(source), "--spec", str(spec_file), "--rows", "100"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| format | mae"))
    quality = _table(lines[start : start + 7])
    start = next(i for i, line in enumerate(lines) if line.startswith("| format | weight file"))
    loads = lines[start + 2 : start + 7]
    assert [row.split("|")[1].strip() for row in loads] == ["fp32", "fp16", "fp8", "int8", "int4"]

    # independently: each folder loaded here, the held-out labelled rows predicted
    contexts = build_contexts(table, spec, stats)
    vectors = encode(contexts)
    held = np.flatnonzero(~contexts.train & ~np.isnan(contexts.labels))
    assert held.size >= 2
    labels = contexts.labels[held] * stats.target_std + stats.target_mean
    folders = {"fp32": source, **{f: source.parent / f"shop.{f}.ckpt" for f in ("fp16", "fp8", "int8", "int4")}}
    predicted, size = {}, {}
    for fmt, folder in folders.items():
        driver = RTDriver.from_spec(spec, checkpoint=folder)
        assert {str(p.dtype) for p in driver.model.parameters()} == {"torch.float32"}  # every format runs fp32
        predicted[fmt] = driver.predict(collate(contexts, vectors, held)).double().numpy()
        size[fmt] = (folder / "model.safetensors").stat().st_size
        assert f"| {size[fmt]:,} B |" in loads[list(folders).index(fmt)]
    assert size["int4"] < size["int8"] < size["fp16"] < size["fp32"] and size["fp8"] < size["fp16"]

    mae = {f: float(np.abs(p - labels).mean()) for f, p in predicted.items()}
    tol = 1e-6 * float(np.abs(labels).max())  # the harness's Quality works in float32
    for fmt in folders:
        row = quality[fmt]
        assert row["mae"] == pytest.approx(mae[fmt], rel=1e-5)
        assert row["mae vs fp16"] == pytest.approx(mae[fmt] - mae["fp16"], abs=tol)
        diff = float(np.abs(predicted[fmt] - predicted["fp16"]).max())
        assert row["max abs output diff vs fp16"] == pytest.approx(diff, abs=tol)
    assert quality["fp16"]["mae vs fp16"] == 0.0
    # below 16 bits the output moves: the delta is not zero (the test can fail on a no-op quantizer)
    assert all(quality[f]["max abs output diff vs fp16"] > 0 for f in ("fp8", "int8", "int4"))


def test_a_quantized_source_and_an_unknown_format_exit_2_writing_nothing(shop_spec, shop_files, tmp_path):
    from flows.cli.app import app

    spec_file = shop_files / "shop_rt.yaml"
    spec_file.write_text(yaml.safe_dump(_regression_spec(shop_spec)))
    folder = tmp_path / "q.ckpt"
    folder.mkdir()
    (folder / "config.json").write_text('{"weight_format": "int8", "num_blocks": 2}')
    res = CliRunner().invoke(app, ["quantize", str(folder), "--spec", str(spec_file)])
    assert res.exit_code == 2 and "holds int8 weights" in " ".join(res.output.split()), res.output
    res = CliRunner().invoke(app, ["quantize", str(folder), "--spec", str(spec_file), "--format", "int3"])
    assert res.exit_code == 2 and "int3" in res.output
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("q.")] == ["q.ckpt"]  # nothing written
