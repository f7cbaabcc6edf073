"""TPC-H generation: once per scale, atomic, and safe when two processes race for it.

``tpchgen-cli`` is replaced by a fake that writes tiny files, so these tests take
milliseconds; the real generator runs once per session in the ``tpch_small`` fixture.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tasks.datasets import tpch as data
from tasks.datasets.tpch import TPCH_TABLES, data_dir, ensure_tpch, tpch_dir
from tasks.runtime.errors import UserError


def fake_generator(monkeypatch: pytest.MonkeyPatch, before_rename=None) -> list[list[str]]:
    """Swap ``tpchgen-cli`` for a fake writing empty files; returns the recorded calls."""
    calls: list[list[str]] = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        out = Path(cmd[cmd.index("--output-dir") + 1])
        for t in TPCH_TABLES:
            (out / f"{t}.parquet").write_text("fake")
        if before_rename is not None:
            before_rename()
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(data.shutil, "which", lambda name: "/fake/tpchgen-cli")
    monkeypatch.setattr(data.subprocess, "run", run)
    return calls


def test_data_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RELFLOW_DATA_DIR", str(tmp_path / "cache"))
    assert data_dir() == tmp_path / "cache"
    assert tpch_dir(0.1) == tmp_path / "cache" / "tpch" / "sf0.1"


def test_generates_once_then_reuses(tmp_path, monkeypatch):
    calls = fake_generator(monkeypatch)
    folder, generated = ensure_tpch(0.5, tmp_path)
    assert generated and folder == tmp_path / "tpch" / "sf0.5"
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{t}.parquet" for t in TPCH_TABLES)
    assert calls[0][:4] == ["/fake/tpchgen-cli", "parquet", "-s", "0.5"]
    assert ensure_tpch(0.5, tmp_path) == (folder, False)
    assert len(calls) == 1
    assert [p.name for p in folder.parent.iterdir()] == ["sf0.5"]  # no temp folder left


def test_an_incomplete_folder_is_replaced(tmp_path, monkeypatch):
    fake_generator(monkeypatch)
    target = tpch_dir(0.5, tmp_path)
    target.mkdir(parents=True)
    (target / "orders.parquet").write_text("half")
    folder, generated = ensure_tpch(0.5, tmp_path)
    assert generated
    assert (folder / "lineitem.parquet").is_file()
    assert (folder / "orders.parquet").read_text() == "fake"


def test_a_concurrent_finisher_keeps_its_copy(tmp_path, monkeypatch):
    target = tpch_dir(0.5, tmp_path)

    def other_process_finishes():
        target.mkdir(parents=True)
        for t in TPCH_TABLES:
            (target / f"{t}.parquet").write_text("theirs")

    fake_generator(monkeypatch, before_rename=other_process_finishes)
    folder, generated = ensure_tpch(0.5, tmp_path)
    assert (folder, generated) == (target, False)
    assert {(folder / f"{t}.parquet").read_text() for t in TPCH_TABLES} == {"theirs"}
    assert [p.name for p in folder.parent.iterdir()] == ["sf0.5"]


def test_generator_failure_is_a_user_error_and_leaves_nothing(tmp_path, monkeypatch):
    def run(cmd, **kwargs):
        raise subprocess.CalledProcessError(2, cmd, "", "bad scale")

    monkeypatch.setattr(data.shutil, "which", lambda name: "/fake/tpchgen-cli")
    monkeypatch.setattr(data.subprocess, "run", run)
    with pytest.raises(UserError, match="bad scale"):
        ensure_tpch(0.5, tmp_path)
    assert list((tmp_path / "tpch").iterdir()) == []


def test_missing_generator_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(data.shutil, "which", lambda name: None)
    with pytest.raises(UserError, match="pip install"):
        ensure_tpch(0.5, tmp_path)


def test_real_tpch_small(tpch_small):
    assert pq.ParquetFile(tpch_small / "orders.parquet").metadata.num_rows == 15_000
    assert ensure_tpch(0.01) == (tpch_small, False)
