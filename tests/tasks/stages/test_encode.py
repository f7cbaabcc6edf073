"""Text cells: the ``text`` kind, the application's encoder (default hashed, plug-ins by
import path), null and empty strings as present cells, and bad input as exit 2."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
import yaml

from tasks.libraries.reference.engine import Engine
from tasks.run.chain import Chain
from tasks.runtime.errors import UserError
from tasks.sources.files import check_sources, resolve_sources
from tasks.spec import parse_spec
from tasks.stages.encode import encode_column, hashed, load_encoder
from tasks.stages.retrieve import list_root_keys
from tests.reference_hashes import M64, splitmix64
from tests.repo import REPO


def test_hashed_is_deterministic_normalised_and_similarity_aware():
    texts = pa.array(["Quick brown fox", "quick  BROWN fox", "lazy dog sleeps", "", "x"])
    a, b = hashed(texts, 32), hashed(texts, 32)
    assert a.dtype == np.float32 and a.shape == (5, 32)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, rtol=1e-5)
    assert a[0] @ a[1] > 0.8  # case and spacing do not matter much
    assert a[0] @ a[1] > a[0] @ a[2]
    assert np.abs(a[3]).sum() > 0  # the empty string has a vector of its own
    # the same cell hashes the same whatever else is in the array (no per-batch state)
    np.testing.assert_array_equal(hashed(texts.slice(2, 2), 32), a[2:4])


def _reference_hashed(text: str, dim: int) -> np.ndarray:
    """The hashed encoder's definition, one string at a time in plain Python: byte trigrams
    and ``bytes.split()`` words (no empty words), polynomial hashes with base P plus the
    length times P, words salted, splitmix64, slot = h % dim, sign from the top bit."""
    P, salt = 0x100000001B3, 0x5BD1E9955BD1E995
    b = text.lower().encode()
    hashes = []
    for i in range(len(b) - 2):
        h = 0
        for byte in b[i : i + 3]:
            h = (h * P + byte) % M64
        hashes.append((h + 3 * P) % M64)
    for word in b.split():
        h = sum(byte * pow(P, i, M64) for i, byte in enumerate(word)) % M64
        hashes.append(((h + len(word) * P) % M64) ^ salt)
    out = np.zeros(dim)
    for h in map(splitmix64, hashes):
        out[h % dim] += -1.0 if h >> 63 else 1.0
    return out / (np.linalg.norm(out) or 1.0)


@pytest.mark.parametrize(
    "text",
    [
        "rs. furiously even ",  # a trailing space: pyarrow's split gave an extra empty word, or kept the space
        "  leading and   runs\tof\nwhitespace  ",
        "one",
        "ab",  # too short for a trigram: words only
        "Ünïcode wörds ok",
    ],
)
def test_hashed_is_its_definition_words_are_bytes_split(text):
    """Found by the output check (issue 21): one row's vector changed from call to call with
    the memory after its buffer. The vector is now its definition, for any neighbours."""
    got = hashed(pa.array(["x y", text]), 16)[1]
    np.testing.assert_allclose(got, _reference_hashed(text, 16), atol=1e-6)
    # last in its buffer, first, or alone: the same vector
    np.testing.assert_array_equal(hashed(pa.array([text]), 16)[0], got)
    np.testing.assert_array_equal(hashed(pa.array([text, "tail"]), 16)[0], got)


def test_nulls_stay_null_entries_and_empty_strings_are_values():
    col = encode_column(pa.array([None, "", "a b", None], pa.string()), load_encoder("hashed", 8), 8)
    assert pa.types.is_fixed_size_list(col.type) and col.type.list_size == 8
    assert col.is_null().to_pylist() == [True, False, False, True]
    empty, ab = (np.array(col[i].as_py()) for i in (1, 2))
    assert np.abs(empty).sum() > 0 and not np.allclose(empty, ab)


def shop_text_spec(shop_spec: dict, **text) -> dict:
    spec = copy.deepcopy(shop_spec)
    spec["schema"]["root"]["columns"]["c_note"] = "text"
    spec["schema"]["branches"][0]["branches"][0]["columns"]["l_note"] = "text"
    spec["run"]["text"] = {"dim": 8, **text}
    return spec


@pytest.fixture
def text_files(shop_tables, write_tables) -> Path:
    t = dict(shop_tables)
    t["customers"] = t["customers"].append_column("c_note", pa.array(["loyal customer", "", None, "new", "late payer"]))
    lines = t["lines"]
    notes = ["fragile", None, "", "ok", "quick", "slow deposits", "x", "", "fine", None, "orphan"]
    t["lines"] = lines.append_column("l_note", pa.array(notes[: lines.num_rows]))
    return write_tables(t)


def prepare(spec_dict: dict, folder: Path):
    """The harness's chain over every root key; the encode step's own output for its counts."""
    spec = parse_spec(spec_dict)
    sources = resolve_sources(spec, folder)
    check_sources(spec, sources)
    keys, _ = list_root_keys(spec, sources)
    chain = Chain(spec, sources, torch.device("cpu"))
    seen: dict[str, int] = {}
    prepared = chain.prepare(keys, lambda stage, seconds, rows: seen.setdefault(stage, rows))
    assert list(seen) == ["retrieve", "preprocess", "encode", "tensorize"]
    return spec, chain.schema, chain.encoding, prepared, prepared.tz


def test_text_cells_reach_the_model_with_nulls_and_empties_present(shop_spec, text_files):
    spec, schema, enc, encoded, tz = prepare(shop_text_spec(shop_spec), text_files)
    assert [c.name for c in schema.root.text] == ["c_note"] and schema.root.text[0].width == 8
    root = tz.batch.nodes["root"]
    assert root.text.shape == (5, 1, 8)
    assert root.text_null[:, 0].tolist() == [False, False, True, False, False]
    assert root.text[1, 0].abs().sum() > 0  # "" is a present value with its own vector
    lines = tz.batch.nodes["lines"]
    assert lines.text.shape == (5, 2, 3, 1, 8)
    # every present text cell was encoded (nulls included: they are present null cells)
    assert int(lines.present.sum()) == int(
        (lines.present.unsqueeze(-1) & (lines.text_null | (lines.text.abs().sum(-1) > 0))).sum()
    )
    assert encoded.encode_unit == "cells" and encoded.encoded >= 5 + int(lines.present.sum())
    engine = Engine(spec, schema, torch.device("cpu"), None, encoding=enc)
    engine.train(tz)
    out = engine.predict(tz, ("prediction",))
    assert torch.isfinite(out.tensors["prediction"]).all()
    w = engine.model.coordinates["root"].text_weight_XED
    assert w is not None and w.grad is not None  # text vectors feed the loss


def write_plugin(folder: Path) -> None:
    (folder / "i13_plugin_encoder.py").write_text(
        "import numpy as np\nimport pyarrow.compute as pc\n\n"
        "def by_length(strings):\n"
        "    n = pc.utf8_length(strings).to_numpy(zero_copy_only=False).astype(np.float32)\n"
        "    return np.stack([n, -n, np.ones_like(n), np.zeros_like(n)], axis=1)\n\n"
        "def wrong_width(strings):\n"
        "    return np.zeros((len(strings), 3), np.float32)\n\n"
        "def nan_always(strings):\n"
        "    return np.full((len(strings), 4), np.nan, np.float32)\n\n"
        "def nan_on_long(strings):\n"  # passes the probe ('' and 'probe text'), not the data
        "    n = pc.utf8_length(strings).to_numpy(zero_copy_only=False).astype(np.float32)\n"
        "    out = np.stack([n, -n, np.ones_like(n), np.zeros_like(n)], axis=1)\n"
        "    out[n > 12, 1] = np.inf\n"
        "    return out\n"
    )


def test_plugin_encoder_is_loaded_by_import_path(shop_spec, text_files, tmp_path, monkeypatch):
    write_plugin(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec_dict = shop_text_spec(shop_spec, encoder="i13_plugin_encoder:by_length", dim=4)
    _, _, _, _, tz = prepare(spec_dict, text_files)
    root = tz.batch.nodes["root"]
    assert root.text[:, 0, 0].tolist() == [14.0, 0.0, 0.0, 3.0, 10.0]  # utf8 lengths; null -> 0
    assert root.text_null[:, 0].tolist() == [False, False, True, False, False]


@pytest.mark.parametrize(
    "name, says",
    [
        ("no_such_module_i13:encode", "cannot import module 'no_such_module_i13'"),
        ("i13_plugin_encoder:missing", "has no attribute 'missing'"),
        ("i13_plugin_encoder:wrong_width", "[2, 4]"),
        ("i13_plugin_encoder:nan_always", "non-finite values (NaN or infinity) for 2 of 2 text cells"),
    ],
)
def test_bad_encoder_paths_are_user_errors(name, says, tmp_path, monkeypatch):
    write_plugin(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match=r"run.text.encoder") as err:
        load_encoder(name, 4)
    assert says in str(err.value) and err.value.exit_code == 2


def test_a_plugin_encoders_non_finite_output_on_the_data_is_a_named_error(shop_spec, text_files, tmp_path, monkeypatch):
    write_plugin(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec_dict = shop_text_spec(shop_spec, encoder="i13_plugin_encoder:nan_on_long", dim=4)
    with pytest.raises(UserError) as err:
        prepare(spec_dict, text_files)  # the probe passes; the 14-character cell does not
    msg = str(err.value)
    assert "run.text.encoder 'i13_plugin_encoder:nan_on_long' returned non-finite values" in msg, msg
    assert "for 1 of 4 text cells" in msg and "run.text.encoder=hashed" in msg
    assert err.value.exit_code == 2


def test_encoder_must_be_hashed_or_an_import_path(shop_spec):
    with pytest.raises(UserError, match=r"run.text.encoder.*module:function"):
        parse_spec(shop_text_spec(shop_spec, encoder="not-a-path"))


def test_text_on_a_non_string_column_names_the_column(shop_spec, text_files):
    spec = shop_text_spec(shop_spec)
    spec["schema"]["root"]["columns"]["c_balance"] = "text"
    with pytest.raises(UserError, match=r"Column 'c_balance' .*'text'"):
        prepare(spec, text_files)


@pytest.mark.slow
def test_cli_exits_2_for_a_bad_encoder_path_and_a_non_text_column(shop_spec, text_files, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update({"PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"})
    for name, value in {"bad_path": "nowhere_i13:fn", "numeric_as_text": None}.items():
        spec = shop_text_spec(shop_spec)
        if value is None:
            spec["schema"]["root"]["columns"]["c_balance"] = "text"
        else:
            spec["run"]["text"]["encoder"] = value
        path = text_files / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec))
        proc = subprocess.run(
            [sys.executable, "-m", "flows.cli", "run", str(path)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        text = proc.stdout + proc.stderr
        assert proc.returncode == 2, text
        assert ("nowhere_i13" if value else "c_balance") in text
        assert "Traceback" not in text
        assert not (tmp_path / "outputs").exists()
