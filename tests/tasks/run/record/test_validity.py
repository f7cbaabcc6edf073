"""Which of the offline validity floors judge a request run (single_stream, server).

A request run is judged by LoadGen's rules (tasks/run/scenarios/latency.py: request count, early
stopping, duration, the server's bound and issue lateness). The offline steady-state window
(``run.min_steady_batches``, ``run.min_steady_seconds`` on the predict phase) measures a
throughput pass and does not apply to it; the rules on what it did measure still do: a
train+predict run's training window, recompiles after warm-up, the host's load, quality."""

from __future__ import annotations

import pytest

from tasks.run.record.validity import verdict
from tasks.spec import parse_spec


def _spec(scenario: str, **run):
    return parse_spec(
        {
            "name": "t",
            "source": {"tables": {"a": "a.parquet"}},
            "schema": {"root": {"table": "a", "key": "k", "columns": {"x": "numeric"}}},
            "task": {"target": "y", "kind": "category", "min_quality": 0.9},
            "run": {"scenario": scenario, **run},
        }
    )


# The run the issue saw: single_stream, 64 requests over 2 s, 0.408 s of compute in all.
SHORT_PREDICT = {
    "compute.steady_batches": 64,
    "compute.steady_seconds": 0.408,
    "compute.train.steady_batches": 200000,
    "compute.train.steady_seconds": 5.0,
    "quality.accuracy": 0.95,
}


@pytest.mark.parametrize("scenario", ["single_stream", "server"])
def test_a_request_run_is_not_held_to_the_offline_steady_window(scenario):
    spec = _spec(scenario, request={"min_requests": 64, "min_duration_s": 2})
    assert verdict(spec, SHORT_PREDICT, "accuracy") == []


def test_an_offline_run_still_is():
    reasons = verdict(_spec("offline"), SHORT_PREDICT, "accuracy")
    assert reasons == ["compute.steady_seconds 0.408 < run.min_steady_seconds 1.0"]


@pytest.mark.parametrize("scenario", ["single_stream", "server"])
def test_a_request_run_keeps_the_rules_on_what_it_measured(scenario):
    metrics = {
        **SHORT_PREDICT,
        "compute.train.steady_batches": 0,
        "compute.train.steady_seconds": 0.0,
        "compute.recompiles": 2,
        "host.other_cpu_fraction": 0.7,
        "quality.accuracy": 0.5,
    }
    reasons = verdict(_spec(scenario, max_recompiles=0), metrics, "accuracy")
    assert reasons == [
        "compute.train.steady_batches 0 < run.min_steady_batches 10",  # train+predict trained
        "compute.train.steady_seconds 0.000 < run.min_steady_seconds 1.0",
        "compute.recompiles 2 > run.max_recompiles 0",  # a recompile lands in a request's latency
        "host.other_cpu_fraction 0.70 > run.max_host_load 0.5 (other processes used the cores)",
        "quality.accuracy 0.5000 < task.min_quality 0.9",
    ]
    # from a checkpoint there is no training window to judge
    assert verdict(_spec(scenario, mode="predict", checkpoint="m.ckpt"), SHORT_PREDICT, "accuracy") == []
