"""Requests you can open: sampled requests of a request scenario as MLflow traces.

One trace per sampled request, linked to the run, one child span per step in the order they
ran: ``queue`` (server: scheduled arrival to its batch's start; 0 in single_stream), then
``retrieve``, ``preprocess``, ``encode`` (text columns only), ``tensorize``, ``compute``,
``calibrate``, ``write``. A p99 outlier opened in the MLflow UI's trace view shows which
step was slow. The root span's inputs (request, why traced, latency rank) and outputs (latency,
slowest step and its ms) are what the UI's trace list shows in its default Input and Output
columns: without them every row read ``-`` and the slow step was seen only by opening each.

Tracing stays out of the timed region entirely: the traces are built afterwards from what
the scenario recorded anyway (each request's start, queue wait and step seconds), with
explicit timestamps: the root span runs from the request's start (server: its scheduled
arrival) for its measured latency, and the step spans are laid back to back from its start
at their measured durations. The gap a trace shows after ``write`` is the harness time
between steps (``latency.step_share.other``); a server batch's requests share its steps.
What logging them costs is ``harness.trace_logging_seconds``, per trace
``harness.trace_logging_seconds_per_trace``.

Which requests: always the ``TRACE_SLOWEST`` slowest (the outliers worth opening), plus a
``run.request.trace_sample_rate`` share of all steady requests drawn with ``run.seed``
(the same requests for the same spec), so ordinary requests can be compared with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tasks.measure import keys as K
from tasks.measure.clock import wall_clock

TRACE_SLOWEST = 10
SAMPLE_SALT = 0x7ACE  # the sample's own seeded stream, apart from the schedule's and keys' draws
STEP_ORDER = ("retrieve", "preprocess", "encode", "tensorize", "compute", "calibrate", "write")


class RequestTimes(Protocol):
    """What a trace is built from: a request scenario's per-request seconds (the scenarios'
    ``LatencyRecord``, which sits above tracking and so is read through this shape)."""

    @property
    def scenario(self) -> str: ...
    @property
    def latency_s(self) -> list[float]: ...
    @property
    def queue_s(self) -> list[float]: ...
    @property
    def steps_s(self) -> dict[str, list[float]]: ...
    @property
    def start_s(self) -> list[float]: ...
    @property
    def start_unix(self) -> float: ...


@dataclass(frozen=True)
class TraceSpan:
    name: str
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class RequestTrace:
    """One request's trace: the root span (the whole request) and its step spans."""

    name: str
    start_ns: int
    end_ns: int
    spans: tuple[TraceSpan, ...]
    tags: dict[str, str]
    attributes: dict[str, str]
    inputs: dict[str, str]
    outputs: dict[str, str]


def sample_requests(latency_s: np.ndarray, rate: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(slowest, drawn)`` request indices: the ``TRACE_SLOWEST`` slowest (ties: the
    earlier request), and ``round(rate * n)`` drawn without replacement with ``seed``."""
    n = len(latency_s)
    slowest = np.argsort(-latency_s, kind="stable")[:TRACE_SLOWEST]
    rng = np.random.default_rng([seed, SAMPLE_SALT])
    drawn = rng.choice(n, size=round(rate * n), replace=False) if n else np.empty(0, dtype=np.int64)
    return np.sort(slowest), np.sort(drawn)


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def request_traces(rec: RequestTimes, rate: float, seed: int) -> list[RequestTrace]:
    """The sampled requests of ``rec`` as traces (see the module note for the layout)."""
    latency = np.asarray(rec.latency_s)
    slowest, drawn = sample_requests(latency, rate, seed)
    chosen = np.union1d(slowest, drawn)
    rank = np.empty(len(latency), dtype=np.int64)
    rank[np.argsort(-latency, kind="stable")] = np.arange(1, len(latency) + 1)
    steps = [s for s in STEP_ORDER if s in rec.steps_s] + [s for s in rec.steps_s if s not in STEP_ORDER]
    traces = []
    for i in chosen.tolist():
        start = _ns(rec.start_unix + rec.start_s[i])
        t, spans = start, []
        for name, seconds in (("queue", rec.queue_s[i]), *((s, rec.steps_s[s][i]) for s in steps)):
            spans.append(TraceSpan(name, t, t + _ns(seconds)))
            t = spans[-1].end_ns
        why = ",".join(w for w, group in (("slowest", slowest), ("sampled", drawn)) if i in group)
        worst = max(spans, key=lambda s: s.end_ns - s.start_ns)  # ties: the step that ran first
        rank_text = f"{rank[i]} of {len(latency)} (1: slowest)"
        traces.append(
            RequestTrace(
                name=f"{rec.scenario} request {i}",
                start_ns=start,
                end_ns=max(start + _ns(rec.latency_s[i]), t),  # rounding to ns can add a step's ns
                spans=tuple(spans),
                tags={
                    "relflow.scenario": rec.scenario,
                    "relflow.request": str(i),
                    "relflow.traced_because": why,
                },
                attributes={
                    "relflow.latency_ms": f"{rec.latency_s[i] * 1e3:.3f}",
                    "relflow.latency_rank": rank_text,
                },
                inputs={"request": str(i), "traced_because": why, "latency_rank": rank_text},
                outputs={
                    "latency_ms": f"{rec.latency_s[i] * 1e3:.3f}",
                    "slowest_step": worst.name,
                    "slowest_step_ms": f"{(worst.end_ns - worst.start_ns) / 1e6:.3f}",
                },
            )
        )
    return traces


class TraceStore(Protocol):
    """Where traces go: ``tasks.tracking.writer.Tracker`` (named structurally: the writer imports
    this module's records)."""

    def log_traces(self, traces: Sequence[RequestTrace]) -> None: ...
    def count_traces(self) -> int: ...


def log_request_traces(tracker: TraceStore, rec: RequestTimes, rate: float, seed: int) -> dict[str, float]:
    """Build and store the sampled requests' traces (after the timed region); returns
    ``requests.traces_logged`` (counted back from the store) and what logging cost."""
    start = wall_clock()
    traces = request_traces(rec, rate, seed)
    tracker.log_traces(traces)
    seconds = wall_clock() - start
    stored = tracker.count_traces()
    return {
        K.REQUESTS_TRACES_LOGGED: float(stored),
        K.HARNESS_TRACE_LOGGING_SECONDS: seconds,
        K.HARNESS_TRACE_LOGGING_SECONDS_PER_TRACE: seconds / len(traces) if traces else 0.0,
    }
