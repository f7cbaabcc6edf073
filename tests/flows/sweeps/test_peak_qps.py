"""``relflow-bench peak-qps`` through the real CLI: bad flags exit 2 before any run; a small
search trains once, runs each probe as a fresh-process server child run of one parent, and
logs the probes, the bracket and the chart; the printed table is those child runs' figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parents[3]
SPEC = REPO / "benchmarks" / "tpch_orders.yaml"
# A small spec: the search, the parent/child records and the table are the point here, not the
# figures (a tiny model trains in seconds and serves a probe's requests well within the bound).
SHRINK = [
    "--set",
    "model.d_model=8",
    "--set",
    "model.heads=2",
    "--set",
    "model.layers=1",
    "--set",
    "run.epochs=1",
    "--set",
    "run.system_metrics_interval_s=0",
    "--set",
    "source.generate.tpch.scale=0.002",
    "--set",
    "run.min_steady_batches=1",
    "--set",
    "run.min_steady_seconds=0.000001",
]


def _cli(folder: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        MLFLOW_TRACKING_URI=f"sqlite:///{folder / 'mlflow.db'}",
        PREFECT_HOME=str(folder / "prefect-home"),
        COLUMNS="200",
    )
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", "peak-qps", str(SPEC), *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("args", "names"),
    [
        ([], "--bound-ms"),
        (["--bound-ms", "50", "--probe-requests", "100"], "662"),
        (["--bound-ms", "50", "--set", "run.request.target_qps=-1"], "run.request.target_qps"),
    ],
)
def test_bad_flags_exit_2_before_any_run(tmp_path, args, names):
    proc = _cli(tmp_path, *args, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert names in proc.stdout + proc.stderr
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlartifacts").exists()


@pytest.mark.slow
def test_peak_qps_probes_are_child_server_runs_of_one_parent(tmp_path):
    # A coarse search (bracket within 60%, at most 2 probes: the start rate, then its double or
    # half) keeps it affordable. Each probe is the fewest requests a p99 estimate allows (662) at a
    # high start rate, so a probe is ~7 s of requests (at 20 QPS the three probes were ~60 s).
    proc = _cli(
        tmp_path,
        "--bound-ms",
        "400",
        "--start-qps",
        "100",
        "--probe-seconds",
        "0",
        "--tolerance",
        "0.6",
        "--max-probes",
        "2",
        *SHRINK,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1), text
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exps = [e for e in client.search_experiments() if e.name == "tpch-orders"]
    assert len(exps) == 1, text
    runs = client.search_runs([exps[0].experiment_id])
    parents = [r for r in runs if r.info.run_name.endswith("-peak-qps")]
    assert len(parents) == 1, text
    parent = parents[0]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    probes = [r for r in children if r.data.tags.get("relflow.peak.role") == "probe"]
    assert [r.data.tags.get("relflow.peak.role") for r in children].count("train") == 1
    assert 1 <= len(probes) <= 2
    assert parent.data.metrics["server.peak_probes"] == len(probes)
    logged = json.loads((Path(client.download_artifacts(parent.info.run_id, "peak_probes.json"))).read_text())
    by_run = {r.info.run_id: r for r in probes}
    for p in logged:  # the parent's record is the children's own figures
        child = by_run[p["run_id"]]
        assert child.data.params["run.scenario"] == "server"
        assert child.data.params["run.mode"] == "predict"
        assert float(child.data.params["run.request.target_qps"]) == pytest.approx(p["rate"])
        assert child.data.metrics["latency.requests"] >= 662
        est = child.data.metrics["latency.request_ms.p99_early_stopping"]
        assert est == pytest.approx(p["p99_early_stopping_ms"])
        assert p["passed"] == (est <= 400)
        assert f"{p['rate']:.2f}" in proc.stdout  # the table's row
    if proc.returncode == 0:
        assert parent.data.metrics["server.peak_qps"] == max(p["rate"] for p in logged if p["passed"])
    html = Path(client.download_artifacts(parent.info.run_id, "peak_qps.html")).read_text()
    assert "Early-stopping p99 against Poisson rate" in html
