"""MLPerf Inference LoadGen's early-stopping criterion: a latency percentile that a run of
``n`` requests can support, the fewest requests a percentile needs, and the server's rule.

Definition (mlcommons/inference, ``loadgen/early_stopping.cc`` and
``PerformanceSummary::EarlyStopping`` in ``loadgen/results.cc``; confidence ``c = 0.99``,
tolerance ``d = 0``): a request "overshoots" when it is slower than the percentile ``p``
under test, which it does with probability ``1 - p`` if the true percentile holds. With
``h`` requests under and ``t`` over,

    odds(h, t) = P[Binomial(h + t, 1 - p + d) <= t]

is the chance of seeing so few overshoots, and ``min_passing(t)`` is the smallest ``h``
with ``odds(h, t) < 1 - c`` (LoadGen's binary search uses the strict ``<``).

LoadGen applies it two ways:

- **Single stream** (an estimate): the fewest requests for an estimate of ``p`` is
  ``min_passing(1) + 1`` ("need to process at least h_min + 1 queries"): 64 for p90, 130 for
  p95, 662 for p99. From ``n`` requests, ``t`` is the largest count with
  ``n >= min_passing(t) + t``; the estimate is the ``t``-th slowest latency (LoadGen
  discards the ``t - 1`` slowest and reports the next).
- **Server** (a pass/fail count against the latency bound): ``t`` is the number of requests
  slower than the bound, and the run passes when ``n >= min_passing(t) + t`` (459 requests
  with none over at p99, 662 with one, 838 with two, 1001 with three). LoadGen's
  performance constraint must hold too: the latency at index ``int(n * p)`` of the sorted
  latencies within the bound (``PerfConstraintsMet``; at c = 0.99 the count rule implies it).
  This rule tolerates one more overshoot than comparing the single-stream estimate with the
  bound would: the estimate is the ``t``-th slowest, the rule's threshold the ``(t+1)``-th.

LoadGen evaluates the binomial through a regularised incomplete beta function; here the
binomial CDF is summed in log space (exact up to float rounding). The tests check both
against ``scipy.stats.binom`` and against values from LoadGen's own compiled code.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

CONFIDENCE = 0.99
TOLERANCE = 0.0


def odds(h: int, t: int, p: float, d: float = TOLERANCE) -> float:
    """P[at most ``t`` overshoots in ``h + t`` requests] when each overshoots with ``1 - p + d``."""
    n, q = h + t, 1.0 - p + d
    if q <= 0.0:
        return 1.0
    if q >= 1.0:
        return 1.0 if t >= n else 0.0
    x = np.arange(t + 1, dtype=np.float64)
    # log C(n, x) as a running sum of log((n - k + 1) / k), k = 1..x
    k = x[1:]
    log_choose = np.concatenate([[0.0], np.cumsum(np.log(n - k + 1) - np.log(k))])
    log_terms = log_choose + x * math.log(q) + (n - x) * math.log1p(-q)
    top = float(log_terms.max())
    return float(min(1.0, math.exp(top) * float(np.exp(log_terms - top).sum())))


@lru_cache(maxsize=4096)
def min_passing(t: int, p: float, c: float = CONFIDENCE, d: float = TOLERANCE) -> int:
    """The smallest ``h`` (requests under ``p``) with ``odds(h, t, p, d) < 1 - c``."""
    if not 0.0 < p - d < 1.0:
        raise ValueError(f"percentile {p} with tolerance {d} must lie strictly between 0 and 1")
    # odds falls as h grows: double an upper bound, then bisect (LoadGen bisects too).
    lo, hi = 0, max(1, math.ceil(math.log(1 - c) / math.log(p - d)))
    while odds(hi, t, p, d) >= 1 - c:
        lo, hi = hi + 1, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if odds(mid, t, p, d) < 1 - c:
            hi = mid
        else:
            lo = mid + 1
    return lo


def min_requests(p: float, c: float = CONFIDENCE, d: float = TOLERANCE) -> int:
    """The fewest requests for which an early-stopping estimate of ``p`` exists."""
    return min_passing(1, p, c, d) + 1


def overshoots_tolerated(n: int, p: float, c: float = CONFIDENCE, d: float = TOLERANCE) -> int | None:
    """The largest ``t >= 0`` with ``n >= min_passing(t) + t``: the most requests over a bound
    LoadGen's server rule lets ``n`` requests have (None when ``n < min_passing(0)``, when
    even none over does not pass).

    ``min_passing(t) + t`` grows with ``t``, so this bisects instead of LoadGen's scan."""
    if n < min_passing(0, p, c, d):
        return None
    lo, hi = 0, n  # lo passes; hi may not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if n >= min_passing(mid, p, c, d) + mid:
            lo = mid
        else:
            hi = mid - 1
    return lo


def overshoots_allowed(n: int, p: float, c: float = CONFIDENCE, d: float = TOLERANCE) -> int:
    """The single-stream estimate's rank: the largest ``t >= 1`` with
    ``n >= min_passing(t) + t`` (0 when ``n`` is too few for an estimate)."""
    if n < min_requests(p, c, d):
        return 0
    return overshoots_tolerated(n, p, c, d) or 0  # at least 1 here: n >= min_passing(1) + 1


def estimate(latencies: np.ndarray, p: float, c: float = CONFIDENCE, d: float = TOLERANCE) -> float | None:
    """The early-stopping estimate of percentile ``p`` (a fraction, 0.99 for p99) of
    ``latencies``, or None when there are fewer than ``min_requests(p)`` of them."""
    n = len(latencies)
    t = overshoots_allowed(n, p, c, d)
    if t == 0:
        return None
    # the t-th slowest: partition instead of a full sort
    return float(np.partition(np.asarray(latencies, dtype=np.float64), n - t)[n - t])


def requests_needed(overshoots: int, p: float, c: float = CONFIDENCE, d: float = TOLERANCE) -> int:
    """Requests a run with ``overshoots`` requests over the bound needs in all (LoadGen's
    server rule: ``min_passing(t) + t``), the additional ones all under the bound."""
    return min_passing(overshoots, p, c, d) + overshoots


def percentile_index(n: int, p: float) -> int:
    """LoadGen's percentile sample of ``n`` sorted latencies, 0-based: ``int(n * p)``
    (``ProcessLatencies``: a double product truncated to an index). Not nearest rank: for
    ``n = 900`` it is the 892nd smallest, nearest rank the 891st."""
    return int(n * p)


def server_passes(n: int, overshoots: int, p: float, c: float = CONFIDENCE, d: float = TOLERANCE) -> bool:
    """LoadGen's server scenario with ``overshoots`` of ``n`` requests slower than the bound:
    the early-stopping count rule and the percentile constraint both hold."""
    return n >= requests_needed(overshoots, p, c, d) and overshoots <= n - 1 - percentile_index(n, p)


def server_bound(latencies: np.ndarray, p: float, c: float = CONFIDENCE, d: float = TOLERANCE) -> float | None:
    """The lowest latency bound ``latencies`` pass under LoadGen's server rule: any bound at or
    above it passes, any below fails. None when no bound passes (fewer than
    ``min_passing(0)`` requests).

    With ``t = overshoots_tolerated(n)`` the rule passes iff at most ``t`` latencies exceed
    the bound, i.e. the bound is at least the ``(t+1)``-th slowest; the percentile
    constraint asks it to be at least the sample at ``int(n * p)`` too."""
    n = len(latencies)
    t = overshoots_tolerated(n, p, c, d)
    if t is None:
        return None
    lat = np.asarray(latencies, dtype=np.float64)
    at = max(n - 1 - t, percentile_index(n, p))  # the stricter of the two thresholds
    return float(np.partition(lat, at)[at])
