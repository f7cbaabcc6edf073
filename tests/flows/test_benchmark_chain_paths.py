"""Every path runs the one stage chain (tasks/run/chain.py), so a text spec works wherever
the offline scenario does: training over several chunks then the calibration fit (which once
re-read chunks without the encode step and exited 1), and both request scenarios (whose
request path once had no encode step and handed raw strings to tensorize). Slow: real flows.

Named ``test_benchmark_chain_paths.py`` (tests/README.md): test_benchmark.py holds the flow's main
end-to-end test; this file is one aspect of a benchmark-flow run."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from tasks.spec import load_spec
from tests.repo import ANY_STEADY, NO_SYSTEM_METRICS, REPO, SMALL_MODEL

TEXT_SPEC = REPO / "benchmarks" / "tpch_orders_text_short.yaml"
OVERRIDES = [
    *SMALL_MODEL,
    "run.epochs=2",
    "run.repeats=1",
    "run.device=cpu",
    "run.text.dim=16",
    *ANY_STEADY,
    *NO_SYSTEM_METRICS,
    "run.max_host_load=null",  # other tests share this host's cores
    "run.chunk_rows=4000",  # 15,000 orders at scale 0.01: four chunks
]
REQUESTS = ["run.request.min_duration_s=0", "run.request.roots=2"]
# the fewest requests LoadGen's early stopping needs for each rule's percentile (p90, p99)
SINGLE, SERVER = "run.request.min_requests=64", "run.request.min_requests=662"


@pytest.fixture(scope="module")
def text_runs(prefect_harness, tpch_small, tmp_path_factory):
    from flows.benchmark import benchmark

    folder = tmp_path_factory.mktemp("chain")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        for name, extra in {
            "offline": [],
            "single_stream": ["run.scenario=single_stream", SINGLE, *REQUESTS],
            "server": [
                "run.scenario=server",
                "run.request.target_qps=100",
                "run.request.max_batch=4",
                "run.request.max_wait_ms=5",
                "run.request.latency_bound_ms=600000",
                SERVER,
                *REQUESTS,
            ],
        }.items():
            spec = load_spec(TEXT_SPEC, OVERRIDES + extra)
            summary = benchmark(spec=spec.to_dict(), spec_dir=str(TEXT_SPEC.parent))
            out[name] = (summary, client.get_run(summary["run_id"]))
    return out


@pytest.mark.slow
def test_text_spec_over_several_chunks_trains_calibrates_and_predicts_valid(text_runs):
    summary, run = text_runs["offline"]
    m = run.data.metrics
    assert summary["validity"] == "VALID", summary["invalid_reasons"]
    assert m["data.chunks"] == 4
    assert m["calibration.fit_rows"] > 0  # the fit re-read every chunk, encoded
    # every chunk of both phases went through encode: its rows are each phase's root rows
    assert m["stage.encode.predict.rows"] == m["data.root_rows"] == 15_000
    assert m["stage.encode.train.rows"] == 2 * 15_000  # two epochs, chunks re-read
    assert m["data.text_cells"] == m["data.root_rows"] * 2  # o_comment and one l_comment per order


@pytest.mark.slow
# run.request.check_outputs found (issue 21) that a served text root could differ from the
# offline pass by 0.01-0.04: pyarrow's utf8_split_whitespace split a buffer's last string
# differently from call to call; tasks/stages/encode.py now finds words itself.
@pytest.mark.parametrize("scenario", ["single_stream", "server"])
def test_text_spec_serves_requests_valid_with_encode_in_its_own_bucket(text_runs, scenario):
    summary, run = text_runs[scenario]
    m = run.data.metrics
    assert summary["validity"] == "VALID", summary["invalid_reasons"]
    assert m["latency.requests"] >= 64
    assert m["latency.step_ms.encode.mean"] > 0  # the request path encodes its text
    assert m["latency.step_share.encode"] > 0
    shares = sum(v for k, v in m.items() if k.startswith("latency.step_share."))
    assert shares == pytest.approx(1.0, abs=1e-6)  # every second of a request in one bucket
    # service and response throughput apart: the scenario's wall time holds the service time
    assert m["latency.service_seconds"] <= m["latency.duration_seconds"]
    assert m["latency.rows_per_wall_s"] == pytest.approx(
        m["latency.rows_per_service_s"] * m["latency.service_seconds"] / m["latency.duration_seconds"]
    )
    # per served request (the cold one included), not every request's coordinates over run.repeats
    # (data.coords_reserved sums every served call's): per request, padding stays within reserve
    served = m["latency.requests"] + 1
    assert m["data.padded_coords"] <= m["data.coords_reserved"] / served * (1 + 1e-9)
    # the served predictions are an offline pass's over the same keys (run.request.check_outputs)
    assert m["requests.outputs_roots_checked"] > 0
    assert m["requests.outputs_mismatched_roots"] == 0
    assert m["requests.outputs_max_abs_diff"] <= m["requests.outputs_tolerance"] == 1e-5


@pytest.mark.slow
def test_single_stream_requests_open_as_traces_with_every_step(text_runs):
    """Issue 21: the 10 slowest requests plus a 1% sample as MLflow traces linked to the run,
    each with a span per step (encode included), the slowest one the run's slowest request."""
    summary, run = text_runs["single_stream"]
    m = run.data.metrics
    client = MlflowClient(tracking_uri=summary["tracking_uri"])
    traces = client.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id)
    assert m["requests.traces_logged"] == len(traces)
    assert 10 <= len(traces) <= 10 + round(m["latency.requests"] * 0.01)
    assert m["harness.trace_logging_seconds"] > 0  # after the region, in none of its buckets
    names = ["queue", "retrieve", "preprocess", "encode", "tensorize", "compute", "calibrate", "write"]
    longest = 0
    for t in traces:
        root = next(s for s in t.data.spans if s.parent_id is None)
        # a request that did not queue has a zero-length queue span starting with retrieve:
        # the end time orders the tie
        spans = (s for s in t.data.spans if s.parent_id is not None)
        steps = sorted(spans, key=lambda s: (s.start_time_ns, s.end_time_ns))
        assert [s.name for s in steps] == names
        assert steps[-1].end_time_ns <= root.end_time_ns
        longest = max(longest, root.end_time_ns - root.start_time_ns)
    assert longest / 1e6 == pytest.approx(m["latency.request_ms.max"], abs=1e-5)
