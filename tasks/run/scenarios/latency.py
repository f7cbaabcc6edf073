"""The latency record of a request scenario, its ``latency.*`` metric keys and LoadGen's
validity rules for it (``verdict``).

Per request: total latency (scheduled arrival, or issue in single_stream, to its response
written), time queued, and each step's seconds. The first (cold) request is kept apart and
never enters the percentiles. Shares are sums over the steady requests: a step's share is
its time over the requests' total latency; ``queue`` and ``other`` (harness time between
steps) complete the sum to 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tasks.measure import keys as K
from tasks.run.scenarios import early_stopping
from tasks.run.scenarios.outputs import OutputCheck, ServedOutputs, repeat_key_speedup
from tasks.spec import Request

STEPS = ("retrieve", "preprocess", "tensorize", "compute", "calibrate", "write")
CDF_POINTS = 101  # latency.cdf_ms logged at steps 0..100 (percentiles)
# The percentile each scenario's rule uses: LoadGen's single_stream metric is p90, the
# server's latency constraint p99.
RULE_PERCENTILE = {"single_stream": 90, "server": 99}
SERVER_P = RULE_PERCENTILE["server"] / 100
EARLY_STOPPING_PERCENTILES = (90, 99)
LATENESS_SHARE = 0.05  # server: p99 issue lateness above this share of the bound is INVALID


def nearest_rank_ms(seconds: np.ndarray, q: float | np.ndarray) -> np.ndarray:
    """Nearest-rank percentile(s) ``q`` (0..100) of ``seconds``, in ms: the value at rank
    ceil(q/100 * n) of the sorted values (numpy's ``inverted_cdf``)."""
    return np.asarray(np.percentile(seconds, q, method="inverted_cdf")) * 1e3


@dataclass
class LatencyRecord:
    scenario: str
    latency_s: list[float] = field(default_factory=list)
    queue_s: list[float] = field(default_factory=list)
    steps_s: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in STEPS})
    batch_requests: list[int] = field(default_factory=list)  # requests served per batch
    lateness_s: list[float] = field(default_factory=list)  # server: issue time - scheduled
    # When each steady request started (scheduled arrival, or issue in single_stream), in s
    # after ``start_unix``, the scenario's start: what a request's trace is laid out from.
    start_s: list[float] = field(default_factory=list)
    start_unix: float = 0.0
    first_latency_s: float | None = None
    first_steps_s: dict[str, float] = field(default_factory=dict)
    duration_s: float = 0.0
    target_qps: float | None = None
    roots: int = 1
    intra_op_threads: int = 0  # torch's intra-op threads while serving (0: not recorded)
    wait_s: float = 0.0  # server: idle, waiting for arrivals and batch fill (harness.request_wait_seconds)
    # the served calls' bookkeeping, outside every request's span (harness.request_settle_seconds)
    settle_s: float = 0.0
    # Steady served calls (a server batch once): their step seconds and root rows, so
    # service-time and wall-time throughput are named apart (latency.rows_per_service_s and
    # latency.rows_per_wall_s).
    service_s: float = 0.0
    rows: int = 0
    # Root keys of every served call in order, the cold one included: the rows request quality
    # scored, which the reference pass scores too (tasks/run/reference_pass.py).
    scored_keys: list[np.ndarray] = field(default_factory=list)
    # Root keys of each steady request, aligned with latency_s (requests.repeat_key_speedup).
    request_keys: list[np.ndarray] = field(default_factory=list)
    # run.request.check_outputs: what the served calls wrote, and its comparison with an
    # offline pass after the timed region (tasks/run/scenarios/outputs.py).
    served_outputs: ServedOutputs | None = None
    output_check: OutputCheck | None = None

    def served(self, steps: dict[str, float], rows: int) -> None:
        """One steady served call (a request, or a server batch of them)."""
        self.service_s += sum(steps.values())
        self.rows += rows

    @property
    def served_requests(self) -> int:
        """Requests served, the cold one included (``data.padded_coords`` is per request)."""
        return self.requests + (1 if self.first_latency_s is not None else 0)

    def add(self, latency: float, queue: float, steps: dict[str, float], *, start: float) -> None:
        """One steady request; a step outside ``STEPS`` (``encode`` with text columns) gets
        its own bucket, so no step's seconds fall into ``other``."""
        before = len(self.latency_s)
        self.latency_s.append(latency)
        self.queue_s.append(queue)
        self.start_s.append(start)
        for s in dict.fromkeys((*STEPS, *steps)):
            self.steps_s.setdefault(s, [0.0] * before).append(steps.get(s, 0.0))

    @property
    def requests(self) -> int:
        return len(self.latency_s)

    def percentile_ms(self, q: float) -> float:
        return float(nearest_rank_ms(np.asarray(self.latency_s), q)) if self.latency_s else 0.0

    def early_stopping_ms(self, q: float) -> float | None:
        """LoadGen's early-stopping estimate of percentile ``q``, or None with too few requests."""
        est = early_stopping.estimate(np.asarray(self.latency_s), q / 100)
        return None if est is None else est * 1e3

    def cdf_ms(self) -> list[float]:
        """Latency at percentiles 0..100: the CDF the dashboard draws."""
        if not self.latency_s:
            return []
        return [float(v) for v in nearest_rank_ms(np.asarray(self.latency_s), np.arange(CDF_POINTS))]

    def metrics(self) -> dict[str, float]:
        lat = np.asarray(self.latency_s)
        m: dict[str, float] = {
            K.LATENCY_REQUESTS: float(self.requests),
            K.LATENCY_ROOTS_PER_REQUEST: float(self.roots),
            K.LATENCY_DURATION_SECONDS: self.duration_s,
        }
        if self.first_latency_s is not None:
            m[K.LATENCY_FIRST_REQUEST_MS] = self.first_latency_s * 1e3
            for s, v in self.first_steps_s.items():
                m[K.latency_first_request_step_ms(s)] = v * 1e3
        if not self.requests:
            return m
        for q in (50, 90, 99):
            m[K.latency_request_ms(q)] = self.percentile_ms(q)
        for q in EARLY_STOPPING_PERCENTILES:  # absent when the run is too short for one
            est = self.early_stopping_ms(q)
            if est is not None:
                m[K.latency_early_stopping(q)] = est
        if self.scenario == "server":  # the record does not know the bound: log the lowest that passes
            bound = early_stopping.server_bound(lat, SERVER_P)
            if bound is not None:
                m[K.LATENCY_P99_SERVER_RULE] = bound * 1e3
        m[K.LATENCY_REQUEST_MS_MAX] = float(lat.max() * 1e3)
        m[K.LATENCY_REQUEST_MS_MEAN] = float(lat.mean() * 1e3)
        total = float(lat.sum()) or 1.0
        accounted = 0.0
        for s, seconds in self.steps_s.items():
            step_s = np.asarray(seconds)
            m[K.latency_step_ms_mean(s)] = float(step_s.mean() * 1e3) if len(step_s) else 0.0
            m[K.latency_step_share(s)] = float(step_s.sum()) / total
            accounted += float(step_s.sum())
        queue = np.asarray(self.queue_s)
        m[K.LATENCY_STEP_SHARE_QUEUE] = float(queue.sum()) / total
        m[K.LATENCY_STEP_SHARE_OTHER] = max(total - accounted - float(queue.sum()), 0.0) / total
        m[K.LATENCY_QUEUE_MS_P50] = float(nearest_rank_ms(queue, 50))
        m[K.LATENCY_QUEUE_MS_P99] = float(nearest_rank_ms(queue, 99))
        if self.lateness_s:
            late = np.asarray(self.lateness_s)
            m[K.LATENCY_ISSUE_LATENESS_MS_P50] = float(nearest_rank_ms(late, 50))
            m[K.LATENCY_ISSUE_LATENESS_MS_P99] = float(nearest_rank_ms(late, 99))
            m[K.LATENCY_ISSUE_LATENESS_MS_MAX] = float(late.max() * 1e3)
        m[K.LATENCY_ACHIEVED_QPS] = self.requests / self.duration_s if self.duration_s > 0 else 0.0
        m[K.LATENCY_SERVICE_SECONDS] = self.service_s
        m[K.LATENCY_ROWS_PER_SERVICE_S] = self.rows / self.service_s if self.service_s > 0 else 0.0
        m[K.LATENCY_ROWS_PER_WALL_S] = self.rows / self.duration_s if self.duration_s > 0 else 0.0
        if self.target_qps is not None:
            m[K.LATENCY_TARGET_QPS] = self.target_qps
        if self.intra_op_threads:
            m[K.LATENCY_INTRA_OP_THREADS] = float(self.intra_op_threads)
        if self.batch_requests:
            m[K.LATENCY_BATCH_REQUESTS_MEAN] = float(np.mean(self.batch_requests))
            m[K.LATENCY_BATCH_REQUESTS_MAX] = float(np.max(self.batch_requests))
        m.update(repeat_key_speedup(self.request_keys, self.latency_s))
        if self.output_check is not None:
            m.update(self.output_check.metrics())
        return m


def verdict(scenario: str, r: Request, metrics: dict[str, float]) -> list[str]:
    """LoadGen's rules (``PerformanceSummary`` in ``loadgen/results.cc``): at least
    ``min_requests`` requests over at least ``min_duration_s``; single_stream, enough requests
    for an early-stopping p90 estimate; server, LoadGen's early-stopping count rule and
    percentile constraint at p99 against ``latency_bound_ms`` (``early_stopping.server_passes``,
    judged through ``latency.request_ms.p99_server_rule``, the lowest bound that passes), and
    the generator's issue lateness (ours: LoadGen's generator has a thread to itself)."""
    reasons = []
    n = int(metrics.get(K.LATENCY_REQUESTS, 0))
    if n < r.min_requests:
        reasons.append(f"{K.LATENCY_REQUESTS} {n} < run.request.min_requests {r.min_requests}")
    if scenario == "single_stream" and n < (need := early_stopping.min_requests(RULE_PERCENTILE[scenario] / 100)):
        reasons.append(
            f"{K.LATENCY_REQUESTS} {n} < {need}, the fewest requests LoadGen's early stopping "
            f"(confidence 0.99) needs for a p90 estimate; raise run.request.min_requests to {need}"
        )
    d = metrics.get(K.LATENCY_DURATION_SECONDS, 0.0)
    if d < r.min_duration_s:
        reasons.append(f"{K.LATENCY_DURATION_SECONDS} {d:.2f} < run.request.min_duration_s {r.min_duration_s}")
    if scenario == "server":
        reasons += _server_bound_reasons(n, r, metrics)
        late = metrics.get(K.LATENCY_ISSUE_LATENESS_MS_P99)
        if late is not None and late > LATENESS_SHARE * r.latency_bound_ms:
            reasons.append(
                f"{K.LATENCY_ISSUE_LATENESS_MS_P99} {late:.2f} > {LATENESS_SHARE:.0%} of "
                f"run.request.latency_bound_ms {r.latency_bound_ms}: the load generator, not the "
                "system, set the latency; run on a quieter host or lower run.request.target_qps"
            )
    return reasons


def _server_bound_reasons(n: int, r: Request, metrics: dict[str, float]) -> list[str]:
    """LoadGen's server rule: with ``t`` of ``n`` requests over the bound, INVALID unless
    ``n >= min_passing(t) + t`` (and its p99 sample within the bound)."""
    tolerated = early_stopping.overshoots_tolerated(n, SERVER_P)
    if tolerated is None:
        need = early_stopping.requests_needed(0, SERVER_P)
        return [
            f"{K.LATENCY_REQUESTS} {n} < {need}, the fewest LoadGen's server rule (p99, confidence 0.99) passes "
            f"even with no request over run.request.latency_bound_ms; raise run.request.min_requests to {need}"
        ]
    key = K.LATENCY_P99_SERVER_RULE
    lowest = metrics.get(key)
    if lowest is None:
        return [f"{key} missing: LoadGen's server rule against run.request.latency_bound_ms cannot be checked"]
    if lowest <= r.latency_bound_ms:
        return []
    more = early_stopping.requests_needed(tolerated + 1, SERVER_P)
    return [
        f"{key} {lowest:.1f} > run.request.latency_bound_ms {r.latency_bound_ms}: LoadGen's server rule "
        f"(p99, confidence 0.99) tolerates {tolerated} of {n} requests over the bound and more were "
        f"(one more needs {more} requests, all the others within it)"
    ]
