"""``relflow-bench noise``: bad input stops before any run; the CV of the sample compare tests and
the MDE of compare's test (checked against values computed by hand and by integration); a real
2-run noise floor on the shop tables, each run its own process."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import integrate, optimize, stats

from flows.sweeps.noise import summarize, to_markdown
from tasks.measure import keys as K
from tasks.measure.report import RunSummary
from tests.repo import ANY_STEADY, NO_SYSTEM_METRICS, as_cli

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


def _report(run_id: str, metrics: dict[str, float]) -> RunSummary:
    return RunSummary(run_id=run_id, metrics=metrics, validity="VALID")


def _with_repeats(plain: float, median: float) -> dict[str, float]:
    """A run with run.repeats=4: its plain figure holds pass 0 (the first call), its median
    passes 1..3."""
    key = K.E2E_PREDICT_ROWS_PER_S
    return {key: plain, K.median(key): median, K.REPEATS_MEASURED: 3.0}


def test_summarize_takes_the_cv_of_the_sample_compare_tests():
    # Failed before: noise took the CV of the plain figure (pass 0 and its first call included)
    # while compare tests each run's median over passes 1..N-1: two different figures.
    medians = [100.0, 110.0, 90.0, 105.0]
    plains = [60.0, 40.0, 80.0, 70.0]
    got = summarize(
        [_report(str(i), _with_repeats(p, m)) for i, (p, m) in enumerate(zip(plains, medians, strict=True))]
    )
    # by hand: mean 101.25, squared deviations 1.5625 + 76.5625 + 126.5625 + 14.0625 = 218.75,
    # sample sd sqrt(218.75 / 3) = 8.5391, CV 0.084337
    assert got["noise.e2e.predict.rows_per_s.cv"] == pytest.approx(0.084337, abs=1e-6)
    assert got["noise.e2e.predict.rows_per_s.cv"] == pytest.approx(statistics.stdev(medians) / statistics.mean(medians))


def _max_of_4_sum_quantile(power: float) -> float:
    """The ``power`` quantile of M1 + M2, M the largest of 4 standard normals."""

    def cdf(t: float) -> float:
        density = lambda m: 4 * stats.norm.pdf(m) * stats.norm.cdf(m) ** 3 * stats.norm.cdf(t - m) ** 4  # noqa: E731
        return integrate.quad(density, -np.inf, np.inf)[0]

    return optimize.brentq(lambda t: cdf(t) - power, 0.0, 10.0)


def test_summarize_gives_the_mde_of_the_rank_test_compare_runs():
    # Failed before: the t formula (2.37 CVs at 4 runs a side). Runs that log one tested
    # metric: compare's rank test at 4 vs 4 rejects only on complete separation, so the MDE is
    # the CV times the 80% quantile of the sum of two maxima of 4 standard normals (2.88).
    e2e = [100.0, 110.0, 90.0, 105.0]
    got = summarize([_report(str(i), {K.E2E_PREDICT_ROWS_PER_S: v}) for i, v in enumerate(e2e)])
    cv = statistics.stdev(e2e) / statistics.mean(e2e)
    assert got[K.NOISE_RUNS] == 4
    assert got["noise.e2e.predict.rows_per_s.mde"] == pytest.approx(cv * _max_of_4_sum_quantile(0.8), rel=0.01)


def test_summarize_publishes_no_mde_where_compare_could_mark_nothing():
    # Failed before: a finite MDE for 2 or 3 runs, and for 4 runs with two metrics tested,
    # where the smallest p (2/70) times 2 is above 0.05.
    for n, series in ((2, 1), (3, 1), (4, 2)):
        e2e = [100.0, 110.0, 90.0, 105.0][:n]
        reports = [
            _report(
                str(i),
                {K.E2E_PREDICT_ROWS_PER_S: v, K.STEADY_ROWS_PER_S: 2 * v}
                if series == 2
                else {K.E2E_PREDICT_ROWS_PER_S: v},
            )
            for i, v in enumerate(e2e)
        ]
        got = summarize(reports)
        assert got["noise.e2e.predict.rows_per_s.cv"] == pytest.approx(statistics.stdev(e2e) / statistics.mean(e2e))
        assert not any(k.endswith(".mde") for k in got), (n, got)
        md = to_markdown(reports, got)
        assert "not enough runs" in md and f"{n} a side" in md
    assert not any(k.startswith("noise.compute.train.") for k in got)  # predict runs: no train figure


@pytest.mark.slow
def test_noise_runs_fresh_processes_and_logs_the_cv_of_compares_sample(tmp_path: Path, shop4_files: Path, shop_spec):
    from tasks.tracking.reader import search_runs

    spec_file = shop4_files / "shop.yaml"
    spec_file.write_text(yaml.safe_dump(shop_spec))
    sets = [
        *ANY_STEADY,
        *NO_SYSTEM_METRICS,
        "run.repeats=3",  # each run logs its median over passes 1..2: the sample compare tests
    ]
    args = [str(spec_file), "--runs", "2", *as_cli(sets)]
    got = _noise(args, tmp_path)
    assert got.returncode == 0, got.stderr[-3000:]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    runs = search_runs("shop", uri=uri)
    parents = [r for r in runs if r.tags.get("relflow.report") == "noise"]
    assert len(parents) == 1
    parent = parents[0]
    children = [r for r in runs if r.tags.get("mlflow.parentRunId") == parent.run_id]
    assert len(children) == 2  # one child MLflow run per run
    # each run in a process of its own, none of them the noise command's
    processes = {(c.tags["relflow.pid"], c.tags["relflow.pid_start_unix_s"]) for c in children}
    assert len(processes) == 2
    assert parent.tags["relflow.pid"] not in {pid for pid, _ in processes}
    assert parent.metrics[K.NOISE_RUNS] == 2
    for key in (K.E2E_PREDICT_ROWS_PER_S, K.STEADY_ROWS_PER_S):
        values = [c.metrics[K.median(key)] for c in children]
        assert parent.metrics[K.noise(key, "cv")] == pytest.approx(
            statistics.stdev(values) / statistics.mean(values), rel=1e-6
        )
    train = [c.metrics[K.TRAIN_STEADY_ROWS_PER_S] for c in children]  # one figure per run: no median
    assert parent.metrics[K.noise(K.TRAIN_STEADY_ROWS_PER_S, "cv")] == pytest.approx(
        statistics.stdev(train) / statistics.mean(train), rel=1e-6
    )
    # 2 runs a side: the rank test cannot reject, so no MDE is published
    assert not any(k.endswith(".mde") for k in parent.metrics)
    assert "noise.e2e.predict.rows_per_s.mde: not enough runs (2 a side" in " ".join(got.stdout.split())
    for child in children:  # each run logs its own steady-window noise floor
        assert "compute.steady_batch_ms.cv" in child.metrics
