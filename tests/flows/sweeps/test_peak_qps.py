"""``relflow-bench peak-qps``: a probe passes only when its run is VALID at the bound; the
parent claims ``server.peak_qps`` only when the search bracketed the peak. Through the real
CLI: bad flags exit 2 before any run; a small search trains once, runs each probe as a
fresh-process server child run of one parent, and logs the probes, the bracket and the chart;
the printed table is those child runs' figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from flows.sweeps.launch import Launched
from flows.sweeps.peak import log_result, probe_from
from tasks.measure import keys as K
from tasks.measure.report import RunSummary
from tasks.run.scenarios.peak import PeakResult, Probe, search

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
        (["--bound-ms", "50", "--probe-requests", "100"], "459"),
        (["--bound-ms", "50", "--set", "run.request.target_qps=-1"], "run.request.target_qps"),
    ],
)
def test_bad_flags_exit_2_before_any_run(tmp_path, args, names):
    proc = _cli(tmp_path, *args, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert names in proc.stdout + proc.stderr
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlartifacts").exists()


def _launched(validity: str, p99: float | None, reasons: tuple[str, ...] = (), achieved: float = 19.7) -> Launched:
    metrics = {"latency.achieved_qps": achieved}
    if p99 is not None:  # a real server child logs both; the rule's is one rank below the estimate
        metrics[K.LATENCY_P99_SERVER_RULE] = p99
        metrics["latency.request_ms.p99_early_stopping"] = p99
    report = RunSummary(run_id="r1", metrics=metrics, validity=validity, invalid_reasons=list(reasons))
    return Launched(returncode=0, summary=report, error=None, log="")


LATE = "latency.issue_lateness_ms.p99 9.00 > 5% of run.request.latency_bound_ms 100.0: the load generator ..."
BUSY = "host.other_cpu_fraction 0.70 > run.max_host_load 0.5 (other processes used the cores)"
MISMATCH = "requests.outputs_mismatched_roots 3 > 0 ..."


@pytest.mark.parametrize("reason", [LATE, BUSY, MISMATCH])
def test_an_invalid_probe_never_passes_however_fast(reason):
    p = probe_from(20.0, 100.0, _launched("INVALID", 40.0, (reason,)))
    assert not p.passed
    assert p.validity == "INVALID" and p.reasons == (reason,) and p.p99_ms == 40.0


def test_a_valid_probe_within_the_bound_passes_and_one_over_it_does_not():
    assert probe_from(20.0, 100.0, _launched("VALID", 99.9)).passed
    assert not probe_from(20.0, 100.0, _launched("VALID", 100.1)).passed  # a child judged another bound
    assert not probe_from(20.0, 100.0, _launched("VALID", None)).passed  # too few requests for the rule
    failed = probe_from(20.0, 100.0, Launched(returncode=1, summary=None, error="boom", log=""))
    assert not failed.passed and failed.validity == "FAILED" and failed.reasons == ("boom",)


class FakeTracker:
    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}
        self.tags: dict[str, str] = {}
        self.artifacts: dict[str, object] = {}

    def log_metrics(self, metrics: dict[str, float]) -> None:
        self.metrics.update(metrics)

    def set_tags(self, tags: dict[str, str]) -> None:
        self.tags.update(tags)

    def log_dict(self, obj: object, name: str) -> None:
        self.artifacts[name] = obj

    def log_text(self, text: str, name: str) -> None:
        self.artifacts[name] = text


def _logged(low: float | None, high: float | None, probes: list[Probe]) -> FakeTracker:
    tracker = FakeTracker()
    log_result(tracker, PeakResult(100.0, probes, low=low, high=high))  # type: ignore[arg-type]
    return tracker


def test_peak_qps_is_logged_only_for_a_bracketed_peak():
    both = _logged(20.0, 40.0, [Probe(20.0, 50.0, True), Probe(40.0, 300.0, False)])
    assert both.metrics[K.SERVER_PEAK_QPS] == 20.0
    assert both.metrics[K.SERVER_PEAK_QPS_BRACKET_LOW] == 20.0 and both.metrics[K.SERVER_PEAK_QPS_BRACKET_HIGH] == 40.0
    assert both.tags["relflow.peak.bracketed"] == "True"
    # every probe passed: a lower bound, no peak
    up = _logged(40.0, None, [Probe(20.0, 50.0, True), Probe(40.0, 60.0, True)])
    assert K.SERVER_PEAK_QPS not in up.metrics and K.SERVER_PEAK_QPS_BRACKET_HIGH not in up.metrics
    assert up.metrics[K.SERVER_PEAK_QPS_BRACKET_LOW] == 40.0 and up.tags["relflow.peak.bracketed"] == "False"
    # every probe failed: an upper bound, no peak
    down = _logged(None, 10.0, [Probe(20.0, 300.0, False), Probe(10.0, 290.0, False)])
    assert K.SERVER_PEAK_QPS not in down.metrics and K.SERVER_PEAK_QPS_BRACKET_LOW not in down.metrics
    assert down.metrics[K.SERVER_PEAK_QPS_BRACKET_HIGH] == 10.0
    assert [p["p99_server_rule_ms"] for p in down.artifacts["peak_probes.json"]] == [300.0, 290.0]  # type: ignore[attr-defined]


@pytest.mark.parametrize("reason", [BUSY, MISMATCH])
def test_probes_invalid_within_the_bound_log_no_upper_bound_and_no_unloaded_latency(reason):
    # Failed before: two children INVALID for host load (or output mismatches), p99 40 ms
    # against a 100 ms bound, that kept up: the parent was tagged unloaded_above_bound=True
    # (the latency at low load above the bound, which neither p99 was) and logged the lower
    # rate as server.peak_qps_bracket_high, an upper bound no probe's latency showed.
    res = search(
        lambda rate: probe_from(rate, 100.0, _launched("INVALID", 40.0, (reason,), achieved=rate)),
        bound_ms=100.0,
        start_qps=20.0,
    )
    tracker = FakeTracker()
    log_result(tracker, res)  # type: ignore[arg-type]
    assert [p.rate for p in res.probes] == [20.0, 10.0]
    assert K.SERVER_PEAK_QPS_BRACKET_HIGH not in tracker.metrics and K.SERVER_PEAK_QPS not in tracker.metrics
    assert tracker.tags["relflow.peak.unloaded_above_bound"] == "False"
    assert tracker.tags["relflow.peak.failed_otherwise"] == "True"
    logged = tracker.artifacts["peak_probes.json"]
    assert [(p["passed"], p["missed_bound"], p["reasons"]) for p in logged] == [(False, False, [reason])] * 2  # type: ignore[attr-defined]
    # a child that missed the bound (p99 over it) is the upper end
    over = search(
        lambda rate: probe_from(
            rate, 100.0, _launched("VALID", 40.0, achieved=rate) if rate < 30 else _launched("INVALID", 150.0)
        ),
        bound_ms=100.0,
        start_qps=20.0,
        max_probes=2,
    )
    tracker = FakeTracker()
    log_result(tracker, over)  # type: ignore[arg-type]
    assert tracker.metrics[K.SERVER_PEAK_QPS_BRACKET_HIGH] == 40.0


@pytest.mark.slow
def test_peak_qps_probes_are_child_server_runs_of_one_parent(tmp_path):
    # One outcome, by construction: a bound no probe can miss (60 s; the generator's lateness
    # allowance is 5% of it) and no host-load rule, so every probe of the tiny model is VALID
    # and passes; two probes (the start rate, then its double) never find a failing rate, so
    # the search has a lower bound and no peak: exit 1, server.peak_qps not logged. Each probe
    # is the fewest requests a p99 estimate allows (662) at a high rate, ~7 s of requests.
    proc = _cli(
        tmp_path,
        "--bound-ms",
        "60000",
        "--start-qps",
        "100",
        "--probe-seconds",
        "0",
        "--tolerance",
        "0.6",
        "--max-probes",
        "2",
        *SHRINK,
        "--set",
        "run.max_host_load=null",
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text
    assert "no peak found: every probe passed, up to 200.00 QPS" in proc.stdout, text
    assert "[probe 2] 200.00 QPS: p99 server rule" in text and ", passed (VALID)" in text  # the progress lines
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
    assert sorted(float(r.data.params["run.request.target_qps"]) for r in probes) == [100.0, 200.0]
    assert parent.data.metrics["server.peak_probes"] == 2
    logged = json.loads((Path(client.download_artifacts(parent.info.run_id, "peak_probes.json"))).read_text())
    by_run = {r.info.run_id: r for r in probes}
    for p in logged:  # the parent's record is the children's own figures
        child = by_run[p["run_id"]]
        assert child.data.params["run.scenario"] == "server"
        assert child.data.params["run.mode"] == "predict"
        assert float(child.data.params["run.request.target_qps"]) == pytest.approx(p["rate"])
        assert child.data.metrics["latency.requests"] >= 662
        rule = child.data.metrics["latency.request_ms.p99_server_rule"]
        assert rule == pytest.approx(p["p99_server_rule_ms"])
        assert child.data.tags["relflow.validity"] == p["validity"] == "VALID", p["reasons"]
        assert p["passed"]
        assert f"{p['rate']:.2f}" in proc.stdout  # the table's row
    assert "server.peak_qps" not in parent.data.metrics
    assert "server.peak_qps_bracket_high" not in parent.data.metrics
    assert parent.data.metrics["server.peak_qps_bracket_low"] == 200.0
    assert parent.data.tags["relflow.peak.bracketed"] == "False"
    html = Path(client.download_artifacts(parent.info.run_id, "peak_qps.html")).read_text()
    assert "Peak-QPS search: p99 under LoadGen's server rule against Poisson rate: no peak found" in html
