"""``relflow-bench floors``: the ledger table of a spec's data, cached on the second call, and
bad input as exit 2 before any measurement. In-process (Typer's runner) on the shop tables."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli.app import app

pytestmark = pytest.mark.slow  # a Prefect server and a floor ledger measured for real


def test_floors_prints_every_stage_and_caches_the_ledger(prefect_harness, shop_spec, shop_files, monkeypatch):
    monkeypatch.setenv("RELFLOW_CACHE_DIR", str(shop_files / "cache"))
    monkeypatch.setattr("tasks.run.floors.BUSY_HOST_FRACTION", 1.0)  # caching itself, whatever else runs
    shop_spec["run"]["output_dir"] = str(shop_files / "outputs")
    shop_spec["run"]["mode"] = "predict"  # 5 labelled rows are too few to train on; floors need none
    spec = shop_files / "shop.yaml"
    spec.write_text(yaml.safe_dump(shop_spec))
    first = CliRunner().invoke(app, ["floors", str(spec)])
    assert first.exit_code == 0, first.output
    for stage in ("retrieve", "tensorize", "compute", "write", "orchestration"):
        assert stage in first.output
    assert "measured now" in first.output and "MB/s" in first.output and "GFLOP/s" in first.output
    second = CliRunner().invoke(app, ["floors", str(spec)])
    assert second.exit_code == 0 and "ledger cached" in second.output, second.output
    again = CliRunner().invoke(app, ["floors", str(spec), "--remeasure"])
    assert again.exit_code == 0 and "measured now" in again.output
    assert not list((shop_files / "outputs").glob("*"))  # the write floor leaves no file


def test_a_bad_key_is_exit_2_naming_it(shop_spec, shop_files):
    spec = shop_files / "shop.yaml"
    spec.write_text(yaml.safe_dump(shop_spec))
    res = CliRunner().invoke(app, ["floors", str(spec), "--set", "run.batch_sise=512"])
    assert res.exit_code == 2 and "run.batch_sise" in res.output
