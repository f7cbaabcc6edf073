"""A request run's figures against what its requests really did (issue 35), on one real
single_stream train+predict run under the session's Prefect harness:

- the predict phase's MFU is against the peak at the thread count the requests ran at
  (``run.request.intra_op_threads``), not the process's: the peak cache is seeded with two
  known, different peaks for the two counts, so the denominator is checked exactly;
- ``floor.orchestration.fraction`` counts the calls that went through a Prefect task (each
  training step, and the one requests task), not every stage-table entry (the requests run
  their steps directly): the count is recovered from the logged fraction, floor and seconds;
- the predict phase is not held to the offline steady window (its compute seconds are a slice
  of each request's latency), while its steady seconds are below it.

Named ``test_benchmark_request_figures.py`` (tests/README.md): test_benchmark.py holds the flow's
main end-to-end test; this file is one aspect of a benchmark-flow run.
"""

from __future__ import annotations

import json

import pytest
import torch
from mlflow.tracking import MlflowClient

from tasks.measure import keys as K
from tasks.spec import load_spec
from tests.repo import DEFAULT_SPEC, NO_SYSTEM_METRICS, SMALL_RUN

PROCESS_PEAK, REQUEST_PEAK = 4.0e12, 1.0e12  # FLOP/s, seeded: far above what the small model reaches


def _seed_peaks(cache_dir, process_threads: int, request_threads: int) -> None:
    from tasks.measure.environment import fingerprint

    host = fingerprint(torch.device("cpu"))["relflow.host_fingerprint"]
    entries = {}
    for threads, flops in ((process_threads, PROCESS_PEAK), (request_threads, REQUEST_PEAK)):
        entries[f"{host}|cpu|fp32|threads={threads}"] = {
            "flops_per_s": flops,
            "device": "cpu",
            "dtype": "fp32",
            "threads": threads,
            "size": 1024,
            "measured_unix_s": 0.0,
            "other_cpu_fraction": 0.0,
        }
    cache_dir.mkdir(parents=True, exist_ok=True)
    (cache_dir / "peak_flops.json").write_text(json.dumps(entries))


@pytest.fixture(scope="module")
def request_run(prefect_harness, tpch_small, tmp_path_factory):
    from flows.benchmark import benchmark

    process_threads = torch.get_num_threads()
    request_threads = 1 if process_threads != 1 else 2  # any count but the process's
    folder = tmp_path_factory.mktemp("request_figures")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    overrides = [
        *SMALL_RUN,
        *NO_SYSTEM_METRICS,
        "run.min_steady_batches=1",  # training's window: one steady batch (its rule is not the subject)
        "run.min_steady_seconds=1.0",  # the offline window the run failed on
        "run.scenario=single_stream",
        "run.request.min_requests=64",
        "run.request.min_duration_s=2",
        f"run.request.intra_op_threads={request_threads}",
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.setenv("RELFLOW_CACHE_DIR", str(folder / "cache"))
        _seed_peaks(folder / "cache", process_threads, request_threads)
        summary = benchmark(spec=load_spec(DEFAULT_SPEC, overrides).to_dict(), spec_dir=str(DEFAULT_SPEC.parent))
    metrics = MlflowClient(tracking_uri=uri).get_run(summary["run_id"]).data.metrics
    return summary, metrics, request_threads


@pytest.mark.slow
def test_request_mfu_is_against_the_peak_at_the_requests_thread_count(request_run):
    _, m, request_threads = request_run
    assert m[K.LATENCY_INTRA_OP_THREADS] == request_threads
    assert m[K.PREDICT_REQUEST_PEAK_FLOPS_PER_S] == REQUEST_PEAK
    assert m[K.HOST_PEAK_FLOPS_PER_S] == PROCESS_PEAK
    predict_flops = m[K.compute("predict", K.MODEL_FLOPS_PER_S)]
    assert predict_flops > 0
    assert m[K.compute("predict", K.MFU)] == pytest.approx(predict_flops / REQUEST_PEAK, rel=1e-12)
    reserved = m[K.compute("predict", K.MODEL_FLOPS_PER_S_RESERVED)]
    assert m[K.compute("predict", K.MFU_RESERVED)] == pytest.approx(reserved / REQUEST_PEAK, rel=1e-12)
    # training ran at the process's threads: its MFU stays against the process's peak
    train_flops = m[K.compute("train", K.MODEL_FLOPS_PER_S)]
    assert m[K.compute("train", K.MFU)] == pytest.approx(train_flops / PROCESS_PEAK, rel=1e-12)


@pytest.mark.slow
def test_orchestration_fraction_counts_only_prefect_task_calls(request_run):
    _, m, _ = request_run
    fraction = m[K.floor_fraction("orchestration")]
    calls = fraction * m[K.HARNESS_ORCHESTRATION_SECONDS] * m[K.floor_rate("orchestration")]
    # one epoch: retrieve, preprocess, tensorize and compute of each chunk, then the requests task
    assert calls == pytest.approx(4 * m[K.DATA_CHUNKS] + 1, rel=1e-9)
    assert m[K.LATENCY_REQUESTS] >= 64  # every one of them ran its six steps outside Prefect


@pytest.mark.slow
def test_a_request_run_is_not_held_to_the_offline_predict_steady_window(request_run):
    summary, m, _ = request_run
    assert m[K.compute("predict", "steady_seconds")] < 1.0  # the offline rule would have failed it
    steady = [r for r in summary["invalid_reasons"] if r.startswith(("compute.steady_", "compute.predict.steady_"))]
    assert steady == []
