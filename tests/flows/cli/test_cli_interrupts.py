"""SIGTERM during the file-writing commands other than ``run``, ``quantize`` and ``export``
(those are in tests/flows/test_benchmark_lifecycle.py and test_backends_checkpoints.py): exit 130 and nothing
temporary left, as ``run`` ends (tasks/runtime/interrupts.py, issue 24 item 3).

Before, ``data tpch`` died by the signal (exit 143) and left its ``.sf<scale>-*`` folder of
half-written Parquet under the data folder, with tpchgen-cli still running; ``peak`` died by
it too (its cache's temporary file lives too briefly to catch: the signal comes mid-measure),
and ``noise`` left its parent MLflow run RUNNING.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import yaml
from cli_signals import catches_sigterm, terminate_when

pytestmark = pytest.mark.slow  # a CLI subprocess that starts real work (a few seconds)


def test_sigterm_during_data_tpch_exits_130_and_removes_the_temporary_folder(tmp_path):
    data = tmp_path / "data"
    tpch = data / "tpch"

    def generating(pid: int) -> bool:  # tpchgen-cli has written into the temporary folder
        return tpch.is_dir() and any(any(d.iterdir()) for d in tpch.glob(".sf*") if d.is_dir())

    code, err, seconds, alive = terminate_when(
        ["data", "tpch", "--scale", "0.5"], tmp_path, generating, {"RELFLOW_DATA_DIR": str(data)}
    )
    assert code == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    assert sorted(p.name for p in tpch.iterdir()) == []  # neither the temporary folder nor a data set
    assert not alive  # tpchgen-cli stopped before the exit
    assert seconds < 10


def test_sigterm_during_peak_exits_130_and_caches_nothing(tmp_path):
    cache = tmp_path / "cache"
    code, err, seconds, alive = terminate_when(
        ["peak", "--remeasure"], tmp_path, catches_sigterm, {"RELFLOW_CACHE_DIR": str(cache)}
    )
    assert code == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    assert not cache.exists() or sorted(p.name for p in cache.iterdir()) == []
    assert not alive and seconds < 10


def _runs_in(db: Path) -> list[tuple[str, str]]:
    """(name, status) of every run in an MLflow SQLite store; [] while it is being created."""
    if not db.is_file():
        return []
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            return list(con.execute("SELECT name, status FROM runs"))
    except sqlite3.Error:
        return []


def test_sigterm_during_noise_exits_130_and_ends_its_parent_run_killed(tmp_path, shop_files, shop_spec):
    spec_file = shop_files / "shop.yaml"
    spec_file.write_text(yaml.safe_dump(shop_spec))
    db = tmp_path / "mlflow.db"
    code, err, seconds, alive = terminate_when(
        ["noise", str(spec_file), "--runs", "2"],
        tmp_path,
        lambda pid: any(name.endswith("-noise") for name, _ in _runs_in(db)),
        {"MLFLOW_TRACKING_URI": f"sqlite:///{db}"},
    )
    assert code == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    assert [s for name, s in _runs_in(db) if name.endswith("-noise")] == ["KILLED"]
    assert "RUNNING" not in {s for _, s in _runs_in(db)}  # a child run that had started ended too
    assert not alive and seconds < 10
