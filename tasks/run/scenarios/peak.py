"""The highest Poisson rate whose server run holds a latency bound (LoadGen's
FindPeakPerformance, for the server scenario).

The search only sees probes: ``probe(rate)`` runs a server scenario at ``rate`` and returns
whether it passed, with the p99 LoadGen's server rule judges (``latency.request_ms.p99_server_rule``;
None when the run had too few requests for one: a failed probe).
From the start rate it doubles while probes pass (or halves while they fail) until one
passing and one failing rate are known, then bisects between them (geometrically: rates
span orders of magnitude) until ``ceiling / low <= 1 + tolerance``. ``ceiling`` is the lowest
rate seen to fail for any reason, ``low`` the highest rate seen to pass below it: the peak. A
probe that passes above a failing one (noise near the knee) does not count: the result never
claims a rate above one that failed.

A probe fails by the latency bound (``Probe.missed``: its p99 under the server rule is over
the bound) or for another reason: its run was INVALID with the p99 within the bound (host
load, output mismatches, the generator's lateness, quality) or it has no p99 (the run failed).
Only a probe that missed the bound says the peak is below its rate: ``high``, the bracket's
upper end, is the lowest such rate. A probe that failed otherwise still caps the search (the
result never rests on a rate at or above it), but is no upper bound on the peak.

Halving stops when load is not what sets the latency: two failing probes in a row that both
missed the bound, kept up with their arrivals (achieved QPS at least ``KEPT_UP`` of the
target), and whose p99 differ by less than ``FLOOR_RATIO`` (halving the rate left the p99
over the bound where it was, so the unloaded latency is above the bound). Lower rates would
only take longer (a probe of the default 662 requests: 530 s at 1.25 QPS) and fail the same;
the result says so (``unloaded_above_bound``). Measured here on the default workload: 294, 287
and 288 ms at 10, 5 and 2.5 QPS against a 100 ms bound. It stops, too, when two failing probes
in a row both failed for another reason (``failed_otherwise``): a lower rate cures neither a
busy host nor wrong outputs, and says nothing about the latency at low load.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from tasks.run.scenarios.early_stopping import requests_needed
from tasks.runtime.errors import UserError

FLOOR_RATIO = 0.9  # p99 at half the rate above this share of the p99 at the rate: no load effect
KEPT_UP = 0.8  # achieved / target QPS of a probe that kept up (a Poisson run of 662 requests varies ~4%)


@dataclass(frozen=True)
class Probe:
    rate: float  # target QPS the probe ran at
    p99_ms: float | None  # its p99 under LoadGen's server rule (None: too few requests)
    passed: bool
    run_id: str | None = None
    achieved_qps: float | None = None
    validity: str | None = None
    reasons: tuple[str, ...] = ()

    def missed(self, bound_ms: float) -> bool:
        """Failed by the latency bound: its p99 under the server rule is over ``bound_ms``
        (not an INVALID run within the bound, nor one without a p99)."""
        return not self.passed and self.p99_ms is not None and self.p99_ms > bound_ms


@dataclass
class PeakResult:
    bound_ms: float
    probes: list[Probe] = field(default_factory=list)
    low: float | None = None  # highest passing rate below every failing one (the peak)
    high: float | None = None  # lowest rate whose probe missed the bound (an upper bound on the peak)
    unloaded_above_bound: bool = False  # halving the rate left the p99 over the bound (see module doc)
    failed_otherwise: bool = False  # halving stopped: two probes failed for reasons other than the bound

    @property
    def bracketed(self) -> bool:
        return self.low is not None and self.high is not None

    @property
    def ceiling(self) -> float | None:
        """The lowest rate whose probe failed, for any reason: the search never claims above it."""
        failed = [p.rate for p in self.probes if not p.passed]
        return min(failed) if failed else None


ProbeFn = Callable[[float], Probe]


def search(
    probe: ProbeFn,
    *,
    bound_ms: float,
    start_qps: float,
    tolerance: float = 0.05,
    max_probes: int = 16,
    min_qps: float = 0.1,
    max_qps: float = 1e6,
) -> PeakResult:
    """Bracket the peak rate within ``tolerance``; ``probe(rate).passed`` is the rule."""
    if start_qps <= 0 or bound_ms <= 0 or tolerance <= 0:
        raise UserError("peak-qps needs a start rate, --bound-ms and a tolerance above 0.")
    res = PeakResult(bound_ms)

    def run(rate: float) -> bool:
        p = probe(rate)
        res.probes.append(p)
        missed = [q.rate for q in res.probes if q.missed(bound_ms)]
        res.high = min(missed) if missed else None
        ceiling = res.ceiling
        below = [q.rate for q in res.probes if q.passed and (ceiling is None or q.rate < ceiling)]
        res.low = max(below) if below else None
        return p.passed

    run(start_qps)
    while len(res.probes) < max_probes:
        ceiling = res.ceiling
        if res.low is not None and ceiling is not None:
            if ceiling / res.low <= 1 + tolerance:
                break
            rate = math.sqrt(res.low * ceiling)  # bisect the bracket
        elif ceiling is None:  # every probe passed: double the highest
            rate = 2 * max(p.rate for p in res.probes)
        else:  # nothing passed below the lowest failure: halve it, unless that stopped helping
            if _latency_floor_reached(res.probes, bound_ms):
                res.unloaded_above_bound = True
                break
            if _failed_otherwise(res.probes, bound_ms):
                res.failed_otherwise = True
                break
            rate = ceiling / 2
        if not min_qps <= rate <= max_qps:
            break
        run(rate)
    return res


def _latency_floor_reached(probes: list[Probe], bound_ms: float) -> bool:
    """The last two probes missed the bound (p99 over it: not merely INVALID for another
    reason), the later at the lower rate, with p99s within FLOOR_RATIO, and both kept up with
    their rate (a saturated server falls behind its arrivals: its p99 is set by the backlog,
    which halving the rate can still clear)."""
    if len(probes) < 2:
        return False
    upper, lower = probes[-2], probes[-1]
    if not (upper.missed(bound_ms) and lower.missed(bound_ms)) or lower.rate >= upper.rate:
        return False
    assert upper.p99_ms is not None and lower.p99_ms is not None  # missed: a p99 over the bound
    kept_up = all(p.achieved_qps is not None and p.achieved_qps >= KEPT_UP * p.rate for p in (upper, lower))
    return kept_up and lower.p99_ms > FLOOR_RATIO * upper.p99_ms


def _failed_otherwise(probes: list[Probe], bound_ms: float) -> bool:
    """The last two probes failed, the later at the lower rate, neither by the bound: each run
    INVALID with its p99 within the bound, or without a p99 (the run failed)."""
    if len(probes) < 2:
        return False
    upper, lower = probes[-2], probes[-1]
    failed = not upper.passed and not lower.passed and lower.rate < upper.rate
    return failed and not upper.missed(bound_ms) and not lower.missed(bound_ms)


def check_args(bound_ms: float, probe_requests: int, probe_seconds: float, tolerance: float) -> None:
    """Bad flags fail before any run starts."""
    if bound_ms <= 0:
        raise UserError(f"--bound-ms is {bound_ms:g}; give the latency bound in ms, above 0.")
    need = requests_needed(0, 0.99)  # LoadGen's server rule: n >= min_passing(t) + t, t = 0
    if probe_requests < need:
        raise UserError(
            f"--probe-requests is {probe_requests}; LoadGen's server rule (p99, confidence 0.99) passes no "
            f"run of fewer than {need} requests, even with none over the bound; use {need} or more "
            f"({requests_needed(1, 0.99)} tolerates one request over it)."
        )
    if probe_seconds < 0 or tolerance <= 0:
        raise UserError("--probe-seconds must be 0 or more and --tolerance above 0.")
