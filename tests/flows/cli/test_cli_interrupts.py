"""SIGTERM during the file-writing commands other than ``run``, ``quantize`` and ``export``
(those are in test_lifecycle.py and test_cli_checkpoint_commands.py): exit 130 and nothing
temporary left, as ``run`` ends (tasks/runtime/interrupts.py, issue 24 item 3).

Before, ``data tpch`` died by the signal (exit 143) and left its ``.sf<scale>-*`` folder of
half-written Parquet under the data folder, with tpchgen-cli still running; ``peak`` died by
it too (its cache's temporary file lives too briefly to catch: the signal comes mid-measure).
"""

from __future__ import annotations

import pytest
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
