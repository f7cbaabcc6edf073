"""A profiled train+predict flow run: MFU per phase, thread tags, the steady-window profile
as artifacts, and the profiled tag that keeps it out of history by default.

Named ``test_benchmark_profile_mfu.py`` (tests/README.md): test_benchmark.py holds the flow's main
end-to-end test; this file is one aspect of a benchmark-flow run."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from dashboards.history import select_history_runs
from tasks.spec import load_spec
from tasks.tracking.reader import search_runs
from tests.repo import NO_SYSTEM_METRICS, REPO, SMALL_RUN

OVERRIDES = [
    *SMALL_RUN,
    "run.profile=true",
    "run.profile_batches=2",
    "run.warmup_batches=1",
    *NO_SYSTEM_METRICS,
]


@pytest.mark.slow
def test_profiled_run_logs_mfu_profile_and_thread_tags(prefect_harness, tpch_small, tmp_path, monkeypatch):
    from flows.benchmark import benchmark

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    spec = load_spec(REPO / "benchmarks" / "tpch_orders.yaml", OVERRIDES)
    summary = benchmark(spec=spec.to_dict(), spec_dir=str(REPO / "benchmarks"))
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(summary["run_id"])
    m = run.data.metrics
    peak = m["host.peak_flops_per_s"]
    for prefix in ("compute", "compute.train"):
        # The definitions, exactly: each MFU is its FLOP rate over the logged peak.
        assert m[f"{prefix}.mfu"] == pytest.approx(m[f"{prefix}.model_flops_per_s"] / peak, rel=1e-9), prefix
        assert m[f"{prefix}.mfu_reserved"] == pytest.approx(
            m[f"{prefix}.model_flops_per_s_reserved"] / peak, rel=1e-9
        ), prefix
        assert 0 < m[f"{prefix}.mfu"] <= 1, prefix
    # The reserved predict rate is the logged FLOPs per root row (reserved shape) times the
    # steady exact rows/s; the present rate counts each row at its own shape, so per steady
    # row it is strictly below the reserved count (TPC-H orders fill < 1 of their lineitem
    # slots) and above 0. A present rate computed over the reserved shape (the bug issue 19
    # fixed) gives exactly the reserved count here.
    per_row = float(run.data.params["model.flops_per_root_row"])
    rows_per_s = m["compute.steady_rows_per_s"]
    assert m["compute.model_flops_per_s_reserved"] == pytest.approx(per_row * rows_per_s, rel=1e-6)
    assert m["data.occupancy"] < 1
    assert 0 < m["compute.model_flops_per_s"] / rows_per_s < per_row
    # Training counts 3x forward per row (forward + backward), at most the reserved count.
    train_per_row = m["compute.train.model_flops_per_s"] / m["compute.train.steady_rows_per_s"]
    assert 0 < train_per_row < 3 * per_row * 1.01
    tags = run.data.tags
    assert tags["relflow.profiled"] == "true"
    assert tags["relflow.threads.set_by_harness"] == "false"
    assert int(tags["relflow.threads.intra_op"]) >= 1 and "relflow.env.OMP_NUM_THREADS" in tags
    names = {a.path for a in client.list_artifacts(run.info.run_id, "profile")}
    assert {
        "profile/trace_train.json",
        "profile/trace_predict.json",
        "profile/top_ops.json",
        "profile/top_ops.md",
    } <= names
    assert set(summary["profile"]) == {"train", "predict"} and summary["profile"]["predict"]
    for phase in ("train", "predict"):
        table = summary["profile"][phase]
        shares = [r["share"] for r in table]
        assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1 + 1e-9, phase
        # One denominator for every row (all profiled self CPU time, on CPU): each share over
        # its own self CPU ms is the same constant. A share of another measure (total time,
        # calls, a per-row denominator) breaks the equality.
        per_ms = [r["share"] / r["self_cpu_ms"] for r in table if r["self_cpu_ms"] > 0]
        assert len(per_ms) >= 2 and max(per_ms) == pytest.approx(min(per_ms), rel=1e-6), phase
        assert all(r["calls"] >= 1 and r["self_cpu_ms"] >= 0 for r in table), phase
        # the model's GEMMs ran inside the profiled steady batches
        assert {"aten::addmm", "aten::mm", "aten::bmm", "aten::linear"} & {r["op"] for r in table}, phase
    records = search_runs(spec.name, uri=uri)
    assert [r.run_id for r in records] == [summary["run_id"]]
    assert select_history_runs(records, host_fingerprint=None, spec_hash=None)[0] == []
    assert select_history_runs(records, host_fingerprint=None, spec_hash=None, include_profiled=True)[0] == records
