"""``relflow-bench noise``: bad input stops before any run; a real 2-run noise floor on the shop tables."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flows.sweeps.noise import summarize
from tasks.measure import keys as K
from tasks.measure.noise import cv, mde
from tasks.measure.report import RunReport

TIMEOUT_S = 1500


def _noise(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{cwd / 'mlflow.db'}", "COLUMNS": "200"}
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "600"  # each run's own server, on a loaded host
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", "noise", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def test_one_run_is_refused_before_any_work(tmp_path: Path):
    got = _noise(["--runs", "1"], tmp_path)
    assert got.returncode == 2
    assert "--runs 1" in got.stderr and "--runs 6" in got.stderr
    assert not (tmp_path / "mlflow.db").exists()  # no parent run was opened


def test_a_bad_override_is_refused_before_any_work(tmp_path: Path):
    got = _noise(["--set", "run.batch_sise=5"], tmp_path)
    assert got.returncode == 2
    assert "run.batch_sise" in got.stderr
    assert not (tmp_path / "mlflow.db").exists()


def _report(run_id: str, metrics: dict[str, float]) -> RunReport:
    return RunReport(run_id=run_id, metrics=metrics, validity="VALID")


def test_summarize_gives_cv_and_mde_of_each_headline_figure_every_run_logged():
    e2e = [100.0, 110.0, 90.0, 105.0]
    reports = [_report(str(i), {K.E2E_PREDICT_ROWS_PER_S: v, K.STEADY_ROWS_PER_S: 2 * v}) for i, v in enumerate(e2e)]
    got = summarize(reports)
    assert got[K.NOISE_RUNS] == 4
    assert got["noise.e2e.predict.rows_per_s.cv"] == pytest.approx(cv(e2e))
    assert got["noise.e2e.predict.rows_per_s.mde"] == pytest.approx(mde(cv(e2e), 4))
    assert got["noise.compute.steady_rows_per_s.cv"] == pytest.approx(cv(e2e))  # scale-free
    assert not any(k.startswith("noise.compute.train.") for k in got)  # predict runs: no train figure


@pytest.fixture
def shop4_files(write_tables, shop_tables):
    """Four copies of the shop tables under shifted keys (as tests/flows/test_backends_flow.py):
    20 customers, so the validation split holds out rows of both classes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    shift = {"customers": {"c_id": 100}, "orders": {"o_id": 1000, "o_cust": 100}, "lines": {"l_order": 1000}}
    out = {}
    for name, table in shop_tables.items():
        copies = []
        for k in range(4):
            t = table
            for col, step in shift[name].items():
                i = t.schema.get_field_index(col)
                t = t.set_column(i, col, pc.add(t[col], pa.scalar(step * k, pa.int64())))
            copies.append(t)
        out[name] = pa.concat_tables(copies)
    return write_tables(out)


@pytest.mark.slow
def test_noise_runs_fresh_processes_and_logs_cv_and_mde_on_the_parent(tmp_path: Path, shop4_files: Path, shop_spec):
    from tasks.tracking.store import search_runs

    spec_file = shop4_files / "shop.yaml"
    spec_file.write_text(yaml.safe_dump(shop_spec))
    sets = ["run.min_steady_batches=1", "run.min_steady_seconds=0.000001", "run.system_metrics_interval_s=0"]
    args = [str(spec_file), "--runs", "2", *(a for s in sets for a in ("--set", s))]
    got = _noise(args, tmp_path)
    assert got.returncode == 0, got.stderr[-3000:]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    runs = search_runs("shop", uri=uri)
    parents = [r for r in runs if r.tags.get("relflow.report") == "noise"]
    assert len(parents) == 1
    parent = parents[0]
    children = [r for r in runs if r.tags.get("mlflow.parentRunId") == parent.run_id]
    assert len(children) == 2  # one child MLflow run per fresh process
    assert parent.metrics[K.NOISE_RUNS] == 2
    for key in (K.E2E_PREDICT_ROWS_PER_S, K.STEADY_ROWS_PER_S, K.TRAIN_STEADY_ROWS_PER_S):
        values = [c.metrics[key] for c in children]
        assert parent.metrics[K.noise(key, "cv")] == pytest.approx(cv(values), rel=1e-6)
        assert parent.metrics[K.noise(key, "mde")] == pytest.approx(mde(cv(values), 2), rel=1e-6)
        assert math.isfinite(parent.metrics[K.noise(key, "mde")])
    for child in children:  # each run logs its own steady-window noise floor
        assert "compute.steady_batch_ms.cv" in child.metrics
    assert "noise.e2e.predict.rows_per_s.mde" in got.stdout
