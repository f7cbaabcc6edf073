"""An ONNX Runtime request run's MFU and floors are at the thread count its session has
(issue 43 item 3).

The session fixes its intra-op threads when it is made: the reference's in the
``backend_setup`` bucket, relational-transformers' by the calibration fit's first call, both at
the process's torch count (two threads here), before the request runner switches torch to
``run.request.intra_op_threads`` (one). The requests' compute ran at the session's two, so the
run's predict thread count (``invocation.predict_threads``: the MFU peak's and the floor
ledger's) is two. On the old code it was ``latency.intra_op_threads``, torch's one: the MFU was
against the one-thread peak (here seeded at a quarter of the two-thread one, so the predict MFU
read four times too high) and the floors were measured at one thread.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from tasks.measure import keys as K
from tasks.run.chain import Chain
from tasks.run.scenarios.invocation import predict_threads
from tasks.run.scenarios.runner import run_requests
from tasks.run.scenarios.workload import Workload
from tasks.sources.files import resolve_sources
from tasks.spec import parse_spec
from tasks.stages.write import PredictionWriter
from tests.tasks.libraries.test_relational_transformers_side import rt_spec

pytestmark = pytest.mark.slow  # a trained model, an ONNX export and a real request path per test

PROCESS, SERVING = 2, 1  # torch's threads when the session is made; run.request.intra_op_threads
PEAKS = {PROCESS: 4.0e12, SERVING: 1.0e12}  # FLOP/s, seeded: far above what the small model reaches


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(PROCESS)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def seeded_peaks(tmp_path, monkeypatch):
    """The peak cache with a known peak at each thread count (nothing measured)."""
    from tasks.measure.environment import fingerprint

    host = fingerprint(torch.device("cpu"))["relflow.host_fingerprint"]
    entries = {
        f"{host}|cpu|fp32|threads={threads}": {
            "flops_per_s": flops,
            "device": "cpu",
            "dtype": "fp32",
            "threads": threads,
            "size": 1024,
            "measured_unix_s": 0.0,
            "other_cpu_fraction": 0.0,
        }
        for threads, flops in PEAKS.items()
    }
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "peak_flops.json").write_text(json.dumps(entries))
    monkeypatch.setenv("RELFLOW_CACHE_DIR", str(cache))


def _workload(raw: dict[str, Any], folder) -> Workload:
    raw["run"].update(
        backend="onnxruntime",
        onnxruntime={"intra_op_threads": 0},  # torch's count when the session is made
        scenario="single_stream",
        warmup_batches=1,
        request={"min_requests": 4, "min_duration_s": 0, "intra_op_threads": SERVING},
    )
    spec = parse_spec(raw)
    work = Workload(Chain(spec, resolve_sources(spec, folder), torch.device("cpu")))
    work.list_keys()
    work.train()
    return work


def test_the_reference_models_onnxruntime_requests_are_judged_at_the_sessions_threads(
    two_threads, seeded_peaks, shop_spec, many_shop_files, tmp_path
):
    from tasks.run.backend_setup import BackendPlan, serving_backend
    from tasks.run.record.collect import utilisation

    shop_spec["model"] = {"d_model": 16, "layers": 1, "heads": 2}
    work = _workload(shop_spec, many_shop_files)
    work.fit_calibration()
    served = serving_backend(work.spec, work.chain, BackendPlan(), None, tmp_path / "run.ckpt")  # at 2 threads
    assert served.tags is not None and served.tags["relflow.onnxruntime.intra_op_threads"] == str(PROCESS)
    writer = PredictionWriter(tmp_path / "requests.parquet")
    rec = run_requests(work, writer)
    writer.abort()
    assert rec.intra_op_threads == SERVING  # torch's count while serving, not the session's
    engine = work.chain.ensure_engine()
    assert engine is not None and engine.session_threads() == PROCESS
    assert predict_threads(engine, rec) == PROCESS
    m = utilisation(work.spec, torch.device("cpu"), engine, engine.facts(), predict_threads(engine, rec))
    assert m[K.PREDICT_REQUEST_PEAK_FLOPS_PER_S] == PEAKS[PROCESS]
    flops = m[K.compute("predict", K.MODEL_FLOPS_PER_S)]
    assert flops > 0
    assert m[K.compute("predict", K.MFU)] == pytest.approx(flops / PEAKS[PROCESS], rel=1e-12)


def test_relational_transformers_session_from_the_calibration_fit_sets_the_runs_threads(
    two_threads, shop_spec, many_shop_files, tmp_path
):
    work = _workload(rt_spec(shop_spec), many_shop_files)
    work.fit_calibration()  # its first predict call makes the library's ONNX session, at 2 threads
    writer = PredictionWriter(tmp_path / "requests.parquet")
    rec = run_requests(work, writer)
    writer.abort()
    assert rec.intra_op_threads == SERVING
    engine = work.chain.ensure_engine()
    assert engine is not None
    assert engine.facts().tags["relflow.onnxruntime.intra_op_threads"] == str(PROCESS)
    engine.close()  # the count outlives the session: the flow asks after the run
    assert predict_threads(engine, rec) == PROCESS
