"""Scheduled history: persistent steps in a metric over time, not single-point outliers.

``detect_steps`` is binary segmentation with robust statistics, in log space (a step is a
ratio). In a segment, the split (leaving ``min_segment`` points a side) goes where two
constant levels fit best (least absolute deviation from each side's median). It becomes a
step when

- the ratio of the two medians is beyond ``threshold`` (default 5%),
- the shift is ``z`` (default 4) standard errors of a median away from zero, with the noise
  scale taken robustly once for the series (MAD of successive differences), and
- each side has ``min_segment`` points nearer its own level than the other's,

and the search recurses into both sides. Medians make a single outlier harmless: it moves
neither side's median, and it cannot form a segment of its own (``min_segment >= 2``).

``history(runs, key)`` applies it to FINISHED runs in start-time order and labels each step
a regression or an improvement for that metric's direction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tasks.measure.keys import E2E_PREDICT_ROWS_PER_S, LATENCY_REQUESTS, STEADY_ROWS_PER_S, latency_request_ms
from tasks.tracking.reader import StoredRun

# Metrics the history walks: throughput (higher is better) and, for request scenarios
# (single_stream / server runs), request latency (lower is better).
HISTORY_METRICS: tuple[str, ...] = (
    E2E_PREDICT_ROWS_PER_S,
    STEADY_ROWS_PER_S,
    latency_request_ms(50),
    latency_request_ms(99),
)
LOWER_IS_BETTER = frozenset({latency_request_ms(50), latency_request_ms(99)})
# A request run's e2e.predict.rows_per_s is rows per second of service time, the cold call
# included (tasks/measure/keys.py), not a throughput: request runs are judged by their latency.
NOT_FOR_REQUEST_RUNS = frozenset({E2E_PREDICT_ROWS_PER_S})
MAD_TO_SIGMA = 1.4826
MEDIAN_SE = math.sqrt(math.pi / 2)  # standard error of a median, in sigma / sqrt(n)


@dataclass(frozen=True)
class Step:
    index: int  # first point of the new level
    before: float  # median of the segment before
    after: float  # median of the segment after
    z: float  # shift in standard errors

    @property
    def ratio(self) -> float:
        return self.after / self.before if self.before else math.inf


def noise_sigma(logs: np.ndarray) -> float:
    """Robust noise scale from successive differences: a few level shifts barely move it."""
    if len(logs) < 3:
        return 0.0
    return MAD_TO_SIGMA * float(np.median(np.abs(np.diff(logs)))) / math.sqrt(2)


def _score(logs: np.ndarray, k: int, sigma: float) -> tuple[float, float]:
    """(log shift of medians, z) for a split before index ``k``."""
    left, right = logs[:k], logs[k:]
    shift = float(np.median(right)) - float(np.median(left))
    se = MEDIAN_SE * sigma * math.sqrt(1 / len(left) + 1 / len(right))
    if se == 0:
        return shift, math.inf if shift != 0 else 0.0
    return shift, abs(shift) / se


def _cost(logs: np.ndarray, k: int) -> float:
    """L1 cost of two constant levels (each side's median): small where the split fits."""
    left, right = logs[:k], logs[k:]
    return float(np.abs(left - np.median(left)).sum() + np.abs(right - np.median(right)).sum())


def _supported(logs: np.ndarray, k: int, min_segment: int) -> bool:
    """Each side has ``min_segment`` points nearer its own level than the other side's."""
    ml, mr = float(np.median(logs[:k])), float(np.median(logs[k:]))
    near_left = np.abs(logs[:k] - ml) < np.abs(logs[:k] - mr)
    near_right = np.abs(logs[k:] - mr) < np.abs(logs[k:] - ml)
    return int(near_left.sum()) >= min_segment and int(near_right.sum()) >= min_segment


def detect_steps(
    values: Sequence[float], *, min_segment: int = 3, threshold: float = 0.05, z: float = 4.0
) -> list[Step]:
    """Indices where the series' level shifts and stays shifted; sorted by index.

    In each segment the split is placed where two constant levels fit best (least absolute
    deviation from each side's median); it is kept as a step when the shift is beyond
    ``threshold``, ``z`` standard errors from zero, and each side holds ``min_segment``
    points nearer its own level. Then both sides are searched again.
    """
    if min_segment < 2:
        raise ValueError("min_segment must be >= 2 (a single point is an outlier, not a step)")
    x = np.asarray(values, dtype=float)
    if np.any(x <= 0) or not np.all(np.isfinite(x)):
        raise ValueError("detect_steps needs positive finite values (throughputs)")
    logs = np.log(x)
    sigma = noise_sigma(logs)
    steps: list[Step] = []

    def search(lo: int, hi: int) -> None:
        seg = logs[lo:hi]
        if len(seg) < 2 * min_segment:
            return
        splits = range(min_segment, len(seg) - min_segment + 1)
        k = min(splits, key=lambda k: (_cost(seg, k), -abs(_score(seg, k, sigma)[0])))
        shift, score = _score(seg, k, sigma)
        if abs(math.expm1(shift)) <= threshold or score < z or not _supported(seg, k, min_segment):
            return
        steps.append(Step(lo + k, float(np.exp(np.median(seg[:k]))), float(np.exp(np.median(seg[k:]))), score))
        search(lo, lo + k)
        search(lo + k, hi)

    search(0, len(logs))
    return sorted(steps, key=lambda s: s.index)


@dataclass(frozen=True)
class HistoryStep:
    metric: str
    step: Step
    kind: str  # "regression" | "improvement"
    before_run: StoredRun  # last run of the old level
    after_run: StoredRun  # first run of the new level


def request_run(metrics: Mapping[str, float]) -> bool:
    """A single_stream or server run (it logged ``latency.requests``)."""
    return LATENCY_REQUESTS in metrics


def judged_by(metrics: Mapping[str, float], key: str) -> bool:
    """Whether a run with these metrics is judged by ``key`` (request runs never by
    ``NOT_FOR_REQUEST_RUNS``)."""
    return metrics.get(key, 0) > 0 and not (key in NOT_FOR_REQUEST_RUNS and request_run(metrics))


def series(runs: Sequence[StoredRun], key: str) -> tuple[list[StoredRun], list[float]]:
    """Runs judged by ``key`` (carrying it, positive) and its values, in the given order."""
    kept = [(r, r.metrics[key]) for r in runs if judged_by(r.metrics, key)]
    return [r for r, _ in kept], [v for _, v in kept]


def history(runs: Sequence[StoredRun], key: str, **kw) -> list[HistoryStep]:
    """Steps of one metric over runs already in start-time order (a rise is an improvement
    unless the metric is in ``LOWER_IS_BETTER``)."""
    kept, values = series(runs, key)
    out = []
    for s in detect_steps(values, **kw) if values else []:
        better = (s.after < s.before) if key in LOWER_IS_BETTER else (s.after > s.before)
        out.append(HistoryStep(key, s, "improvement" if better else "regression", kept[s.index - 1], kept[s.index]))
    return out


def profiled(run: StoredRun) -> bool:
    """Profiled runs are slowed by the profiler: left out of history and compare by default."""
    return run.tags.get("relflow.profiled") == "true"


def drop_invalid(runs: Sequence[StoredRun]) -> tuple[list[StoredRun], list[StoredRun]]:
    """(kept, left out): runs tagged ``relflow.validity=INVALID`` measured something other than
    the configuration (a loaded host, a failed check), so history never steps on them."""
    kept = [r for r in runs if r.tags.get("relflow.validity") != "INVALID"]
    return kept, [r for r in runs if r.tags.get("relflow.validity") == "INVALID"]


def select_history_runs(
    runs: Sequence[StoredRun], *, host_fingerprint: str | None, spec_hash: str | None, include_profiled: bool = False
) -> tuple[list[StoredRun], str | None, str | None]:
    """FINISHED benchmark runs on one host fingerprint (and spec hash), oldest first.

    ``None`` picks the latest benchmark run's value (report runs carry no e2e metric and
    are skipped). Returns (runs, host fingerprint, spec hash) actually used.
    """
    runs = [r for r in runs if include_profiled or not profiled(r)]
    bench = sorted(
        (r for r in runs if r.status == "FINISHED" and E2E_PREDICT_ROWS_PER_S in r.metrics),
        key=lambda r: r.start_time_ms,
    )
    if not bench:
        return [], host_fingerprint, spec_hash
    latest = bench[-1]
    host = host_fingerprint or latest.tags.get("relflow.host_fingerprint")
    spec = spec_hash if spec_hash is not None else latest.tags.get("relflow.spec_hash")
    kept = [
        r
        for r in bench
        if r.tags.get("relflow.host_fingerprint") == host and (spec == "any" or r.tags.get("relflow.spec_hash") == spec)
    ]
    return kept, host, spec
