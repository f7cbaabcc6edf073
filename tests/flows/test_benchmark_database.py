"""Request scenarios and database sources through the real flow: a real PostgreSQL on
127.0.0.1 loaded with TPC-H (scale 0.01), offline and single_stream predict runs against it
whose predictions equal the Parquet source's for the same keys; a server run whose tight
latency bound makes it INVALID; calibration stored in the checkpoint and applied; the
password never reaches MLflow. Slow: several flow runs.

Named ``test_benchmark_database.py`` (tests/README.md): test_benchmark.py holds the flow's main end-
to-end test; this file is one aspect of a benchmark-flow run."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from mlflow.tracking import MlflowClient

from tasks.spec import load_spec
from tests.repo import ANY_STEADY, NO_SYSTEM_METRICS, REPO, SMALL_RUN

DEFAULT_SPEC = REPO / "benchmarks" / "tpch_orders.yaml"
STAGES = ("retrieve", "preprocess", "tensorize", "compute", "calibrate", "write")
OVERRIDES = [
    *SMALL_RUN,
    *ANY_STEADY,
    *NO_SYSTEM_METRICS,
    "task.outputs=[prediction, 'topk:2']",
    "run.max_host_load=null",  # other tests share this host's cores; the request rules are the point
]
REQUESTS = ["run.request.min_duration_s=0", "run.request.roots=2"]
# the fewest requests LoadGen's early stopping needs for each rule's percentile (p90, p99)
SINGLE, SERVER = "run.request.min_requests=64", "run.request.min_requests=662"


@pytest.fixture(scope="module")
def runs(prefect_harness, postgres_server, tpch_small, tmp_path_factory):
    """Train on Parquet, then predict from PostgreSQL (offline, single_stream) with the
    checkpoint, and a server run; returns {name: (summary, MLflow run)} and the store URI."""
    from flows.benchmark import benchmark
    from tasks.sources.databases import load_postgresql

    load_postgresql(postgres_server.dsn, tpch_small)
    folder = tmp_path_factory.mktemp("dbflow")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.setenv("MLFLOW_TRACKING_URI", uri)

        def go(name: str, extra: list[str]) -> dict:
            spec = load_spec(DEFAULT_SPEC, OVERRIDES + extra)
            summary = benchmark(spec=spec.to_dict(), spec_dir=str(DEFAULT_SPEC.parent))
            out[name] = (summary, client.get_run(summary["run_id"]))
            return summary

        trained = go("parquet", [])
        ckpt = trained["checkpoint_path"]
        predict = ["run.mode=predict", f"run.checkpoint={ckpt}", f"source.database.url={postgres_server.dsn}"]
        go("pg_offline", predict)
        go("pg_single", predict + ["run.scenario=single_stream", SINGLE, *REQUESTS])
        go(
            "server",
            [
                "run.mode=predict",
                f"run.checkpoint={ckpt}",
                "run.scenario=server",
                "run.request.target_qps=200",
                "run.request.max_batch=4",
                "run.request.max_wait_ms=5",
                "run.request.latency_bound_ms=0.001",
                SERVER,
                *REQUESTS,
            ],
        )
    return out, uri


def _preds(summary: dict) -> pl.DataFrame:
    return pl.read_parquet(summary["output_path"])


@pytest.mark.slow
def test_postgresql_offline_predictions_equal_parquet(runs):
    out, _ = runs
    a = _preds(out["parquet"][0]).sort("o_orderkey")
    b = _preds(out["pg_offline"][0]).sort("o_orderkey")
    assert a.height == b.height == 15_000
    assert a["o_orderkey"].equals(b["o_orderkey"])
    assert a["prediction"].equals(b["prediction"])
    assert a["top2_labels"].equals(b["top2_labels"])
    diff = (a["top2_scores"].arr.get(0) - b["top2_scores"].arr.get(0)).abs().max()
    assert diff < 1e-6
    m = out["pg_offline"][1].data.metrics
    assert m["data.bytes_read"] > 0 and m["data.root_rows"] == 15_000


@pytest.mark.slow
def test_postgresql_single_stream_predictions_equal_parquet_for_the_same_keys(runs):
    out, _ = runs
    served = _preds(out["pg_single"][0])
    m = out["pg_single"][1].data.metrics
    assert served.height == 2 * (m["latency.requests"] + 1)  # 2 roots a request, + the cold one
    ref = _preds(out["parquet"][0]).join(served.select("o_orderkey").unique(), on="o_orderkey")
    both = served.unique("o_orderkey").sort("o_orderkey").join(ref, on="o_orderkey", suffix="_ref")
    assert both.height == served["o_orderkey"].n_unique()
    assert both["prediction"].equals(both["prediction_ref"].alias("prediction"))
    diff = (both["top2_scores"].arr.get(0) - both["top2_scores_ref"].arr.get(0)).abs().max()
    assert diff < 1e-5  # batch of 2 vs batch of 512: same rows, float sums may reorder


@pytest.mark.slow
def test_latency_run_records_percentiles_shares_and_a_cold_request(runs):
    out, uri = runs
    summary, run = out["pg_single"]
    m = run.data.metrics
    n = m["latency.requests"]
    assert n >= 64
    # Each request's steps also go into the run's stage table (the cold request's too), a
    # second record of the same seconds: the steady requests' seconds of a step, over their
    # total latency, is the step's share. (retrieve's stage row also holds the key listing.)
    total_s = m["latency.request_ms.mean"] / 1e3 * n
    for step in ("preprocess", "tensorize", "compute", "calibrate", "write"):
        steady_s = m[f"stage.{step}.predict.seconds"] - m[f"latency.first_request.step_ms.{step}"] / 1e3
        assert m[f"latency.step_share.{step}"] == pytest.approx(steady_s / total_s, rel=1e-6), step
        assert m[f"latency.step_ms.{step}.mean"] == pytest.approx(steady_s / n * 1e3, rel=1e-6), step
    retrieve_s = m["stage.retrieve.predict.seconds"] - m["latency.first_request.step_ms.retrieve"] / 1e3
    assert m["latency.step_share.retrieve"] * total_s <= retrieve_s * (1 + 1e-9)
    # the cold request's latency holds its own steps
    cold_steps_ms = sum(m[f"latency.first_request.step_ms.{s}"] for s in STAGES)
    assert cold_steps_ms > 0 and m["latency.first_request_ms"] >= cold_steps_ms * (1 - 1e-9)
    # the CDF is the latencies at percentiles 0..100: its points are the logged percentiles
    cdf = MlflowClient(tracking_uri=uri).get_metric_history(run.info.run_id, "latency.cdf_ms")
    values = {x.step: x.value for x in cdf}
    assert sorted(values) == list(range(101))
    for q in (50, 90, 99):
        assert values[q] == pytest.approx(m[f"latency.request_ms.p{q}"]), q
    assert values[100] == pytest.approx(m["latency.request_ms.max"])
    assert values[0] <= m["latency.request_ms.mean"] <= values[100]
    assert summary["validity"] == "VALID"


@pytest.mark.slow
def test_server_run_counts_queueing_and_fails_a_tight_bound(runs):
    out, _ = runs
    summary, run = out["server"]
    m = run.data.metrics
    assert m["latency.target_qps"] == 200 and m["latency.achieved_qps"] > 0
    # 200 QPS into a path that serves far fewer: requests wait, and the wait is counted
    assert m["latency.queue_ms.p99"] > 0 and m["latency.step_share.queue"] > 0
    assert summary["validity"] == "INVALID"
    assert any("latency_bound_ms" in r for r in summary["invalid_reasons"])
    assert run.data.tags["relflow.validity"] == "INVALID"


@pytest.mark.slow
def test_calibration_is_fitted_stored_and_applied(runs):
    out, _ = runs
    trained = out["parquet"][1].data.metrics
    served = out["pg_offline"][1].data.metrics
    assert trained["calibration.temperature"] > 0 and trained["calibration.fit_rows"] > 0
    # predict mode took the temperature from the checkpoint
    assert served["calibration.temperature"] == trained["calibration.temperature"]
    for k in ("nll", "ece", "brier"):
        assert f"quality.{k}" in served and f"quality.uncalibrated.{k}" in served
    # fitted on one half of the held-out cells, scored on the other: together all of them, once
    assert trained["calibration.report_rows"] > 0
    assert trained["calibration.fit_rows"] + trained["calibration.report_rows"] == trained["quality.rows"]


@pytest.mark.slow
def test_password_never_reaches_mlflow(runs, postgres_server):
    from pgserver import PASSWORD

    out, uri = runs
    client = MlflowClient(tracking_uri=uri)
    for name in ("pg_offline", "pg_single"):
        run = out[name][1]
        assert run.data.params["source.database.url"] == postgres_server.dsn
        blob = " ".join([*run.data.params.values(), *run.data.tags.values()])
        assert PASSWORD not in blob
        spec_yaml = Path(client.download_artifacts(run.info.run_id, "spec.yaml")).read_text()
        assert PASSWORD not in spec_yaml
