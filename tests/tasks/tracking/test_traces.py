"""Request traces: the sampler takes the 10 slowest plus the seeded share; traces built from a
hand-made latency record land in a temp SQLite store linked to the run, every step span at its
recorded duration in the order the steps ran; the scenarios record when each request started."""

from __future__ import annotations

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from tasks.measure import keys as K
from tasks.run.scenarios import server, single_stream
from tasks.run.scenarios.latency import LatencyRecord
from tasks.tracking.traces import TRACE_SLOWEST, log_request_traces, request_traces, sample_requests
from tasks.tracking.writer import Tracker
from tests.scripted_time import ScriptedTime

SPAN_ORDER = ["queue", "retrieve", "preprocess", "encode", "tensorize", "compute", "calibrate", "write"]


def test_sampler_takes_the_slowest_ten_plus_the_seeded_share():
    rng = np.random.default_rng(3)
    latency = rng.permutation(1000) * 1e-3  # request i's rank is known: 999 ms is the slowest
    slowest, drawn = sample_requests(latency, 0.01, seed=5)
    assert set(slowest.tolist()) == set(np.argsort(latency)[-TRACE_SLOWEST:].tolist())
    assert len(drawn) == 10 and len(set(drawn.tolist())) == 10  # 1% of 1000, no repeats
    again = sample_requests(latency, 0.01, seed=5)[1]
    assert np.array_equal(drawn, again)  # the same spec samples the same requests
    assert not np.array_equal(drawn, sample_requests(latency, 0.01, seed=6)[1])
    assert len(sample_requests(latency, 0.0, seed=5)[1]) == 0  # rate 0: only the slowest
    assert len(np.union1d(*sample_requests(latency, 1.0, seed=5))) == 1000  # rate 1: all
    few = sample_requests(np.array([0.3, 0.1, 0.2]), 0.01, seed=0)
    assert few[0].tolist() == [0, 1, 2] and len(few[1]) == 0  # fewer than 10: every one


def hand_made_record(n: int = 30) -> LatencyRecord:
    """``n`` server requests, request i's steps i+1 ms each (i: 0..n-1), queued i/10 ms,
    arriving every 50 ms; an ``encode`` step as text columns add it."""
    rec = LatencyRecord("server", start_unix=1_800_000_000.0)
    for i in range(n):
        steps = {s: (i + 1) * 1e-3 for s in SPAN_ORDER[1:]}
        queue = i * 1e-4
        rec.add(queue + sum(steps.values()) + 2e-4, queue, steps, start=0.05 * i)
    return rec


def test_traces_hold_every_step_span_at_its_duration_linked_to_the_run(mlflow_uri):
    rec = hand_made_record()
    tracker = Tracker("traces")
    run_id = tracker.start("r", tags={})
    other = Tracker("traces")
    other_id = other.start("other", tags={})  # a run in the same experiment with none
    logged = log_request_traces(tracker, rec, rate=0.1, seed=0)
    slowest, drawn = sample_requests(np.asarray(rec.latency_s), 0.1, seed=0)
    expected = set(np.union1d(slowest, drawn).tolist())
    assert set(range(20, 30)) <= expected and len(drawn) == 3  # the 10 slowest: requests 20..29
    assert logged[K.REQUESTS_TRACES_LOGGED] == len(expected)
    assert logged[K.HARNESS_TRACE_LOGGING_SECONDS] > 0
    assert logged[K.HARNESS_TRACE_LOGGING_SECONDS_PER_TRACE] == pytest.approx(
        logged[K.HARNESS_TRACE_LOGGING_SECONDS] / len(expected)
    )
    client = MlflowClient(tracking_uri=mlflow_uri)
    traces = client.search_traces(locations=[tracker.experiment_id], run_id=run_id)
    assert client.search_traces(locations=[tracker.experiment_id], run_id=other_id) == []
    assert request_traces(LatencyRecord("server"), 0.01, 0) == []  # no requests, no traces
    assert log_request_traces(other, LatencyRecord("server"), 0.01, 0)[K.REQUESTS_TRACES_LOGGED] == 0
    assert {int(t.info.tags["relflow.request"]) for t in traces} == expected
    for t in traces:
        i = int(t.info.tags["relflow.request"])
        assert t.info.request_metadata["mlflow.sourceRun"] == run_id
        assert t.info.tags["relflow.traced_because"].startswith("slowest" if i >= 20 else "sampled")
        root = next(s for s in t.data.spans if s.parent_id is None)
        steps = sorted((s for s in t.data.spans if s.parent_id is not None), key=lambda s: s.start_time_ns)
        assert [s.name for s in steps] == SPAN_ORDER  # in the order the steps ran
        start_ns = round((rec.start_unix + 0.05 * i) * 1e9)  # its scheduled arrival
        assert root.start_time_ns == start_ns == steps[0].start_time_ns
        assert root.end_time_ns - root.start_time_ns == round(rec.latency_s[i] * 1e9)
        assert steps[0].end_time_ns - steps[0].start_time_ns == round(i * 1e-4 * 1e9)  # queued
        for s in steps[1:]:
            assert s.end_time_ns - s.start_time_ns == round((i + 1) * 1e-3 * 1e9), s.name
        assert all(a.end_time_ns == b.start_time_ns for a, b in zip(steps, steps[1:], strict=False))
        # the trace list's default Input/Output columns read the root's inputs and outputs: the
        # slowest step (every step i+1 ms, the queue i/10 ms: a tie, the first step wins) and why
        assert root.inputs == {
            "request": str(i),
            "traced_because": t.info.tags["relflow.traced_because"],
            "latency_rank": f"{30 - i} of 30 (1: slowest)",
        }
        assert root.outputs == {
            "latency_ms": f"{rec.latency_s[i] * 1e3:.3f}",
            "slowest_step": "retrieve",
            "slowest_step_ms": f"{(i + 1):.3f}",
        }
        assert "slowest_step" in t.info.response_preview and "latency_rank" in t.info.request_preview


def test_the_slowest_step_is_the_longest_span_the_queue_included():
    rec = LatencyRecord("server", start_unix=1_800_000_000.0)
    rec.add(0.050, 0.030, {"retrieve": 0.004, "compute": 0.012}, start=0.0)  # queued longest
    rec.add(0.020, 0.001, {"retrieve": 0.004, "compute": 0.012}, start=0.1)  # computed longest
    out = [t.outputs for t in request_traces(rec, 0.0, 0)]
    assert [(o["slowest_step"], o["slowest_step_ms"]) for o in out] == [("queue", "30.000"), ("compute", "12.000")]


class Ticking(ScriptedTime):
    """A clock that moves only when a request is served (1 s) or the server sleeps."""

    def serve(self, keys: np.ndarray) -> dict[str, float]:
        self.t += 1.0
        return {"retrieve": 0.25, "compute": 0.75}


def test_scenarios_record_when_each_request_started():
    ft = Ticking()
    arrivals = np.array([0.0, 0.5, 4.0])
    rec = server.run(ft.serve, arrivals, np.arange(3).reshape(3, 1), ft.clock, max_batch=1, max_wait_s=0.0)
    assert rec.start_s == pytest.approx(arrivals.tolist())  # scheduled, not when served
    assert rec.start_unix > 1e9
    ft = Ticking()
    keys = iter(np.arange(10).reshape(10, 1))
    rec = single_stream.run(ft.serve, keys, ft.clock, min_requests=3, min_duration_s=0.0)
    assert rec.start_s == pytest.approx([0.0, 1.0, 2.0])  # each issued when the previous ended
