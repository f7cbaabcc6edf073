"""Baseline vs candidate: key metrics side by side, with ratios, marked only when real.

Pure functions from ``RunRecord``s to a ``Comparison`` (no MLflow, no printing).

A side is one run or a group of runs. For each key metric a side yields an ``Estimate``:

- one run with repeats (``run.repeats >= 2`` logs ``<key>.median`` for
  ``e2e.predict.rows_per_s`` and ``compute.steady_rows_per_s``; from 6 repeats also
  ``<key>.median_ci_low/high``): the median of the repeats and its order-statistic 95%
  interval (``tasks.measure.stats``; below 6 samples there is no 95% interval and none is used);
- a group of runs: one sample per run (the run's repeat median when logged, else its value),
  the median over runs and, from 6 runs, the order-statistic 95% interval of that median;
- one run without repeats (or a metric without an interval): a single value, no spread.

A change is **marked** only when it is both larger than ``threshold`` (default 5%) and
significant given the repeats:

- groups with enough runs for the rank test to reach ``alpha`` on both sides
  (two-sided Mann-Whitney U over per-run samples; 4 vs 4 runs is the smallest that can):
  significant when ``p < alpha`` and the ratio of medians is beyond the threshold;
- otherwise, when both sides have an interval: significant when the intervals do not
  overlap, and the change is judged on the *conservative* ratio (the nearer interval edges),
  so a shift is marked only when even the gap between the intervals exceeds the threshold;
- otherwise: "not enough repeats": the ratio is shown and nothing is claimed.

Next to each ratio stands the comparison's **minimum detectable effect** (MDE, from both
sides' between-run CV and run counts, ``tasks.measure.noise``: the smallest change these runs
detect at 95% confidence with 80% power). A change smaller than the MDE is never marked
("below MDE"), even when the rank test happens to call it significant.

Counts fixed by the spec and data (train updates, output bytes per row) have no noise: any
difference beyond the threshold is marked ("exact").

Repeats inside one run are consecutive predict passes in one process; runs are the honest
unit across processes, so per-repeat samples are never pooled across runs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from tasks.measure import keys as K
from tasks.measure.noise import cv, mde_two
from tasks.measure.stats import MIN_CI_SAMPLES, median_interval
from tasks.runtime.errors import UserError
from tasks.tracking.store import RunRecord

# (metric key, direction): +1 higher is better, -1 lower is better, 0 neither.
KEY_METRICS: tuple[tuple[str, int], ...] = (
    (K.E2E_PREDICT_ROWS_PER_S, +1),
    (K.STEADY_ROWS_PER_S, +1),
    (K.FIRST_CALL_SECONDS, -1),
    *((K.stage_seconds(s, "predict"), -1) for s in K.STAGES),
    (K.E2E_TRAIN_ROWS_PER_S, +1),
    (K.TRAIN_STEADY_ROWS_PER_S, +1),
    (K.HOST_PEAK_BYTES, -1),
    (K.OUTPUT_BYTES_PER_ROW, -1),
    (K.TRAIN_UPDATES, 0),
    (K.TRAIN_UPDATES_PER_EPOCH, 0),
    # request scenarios (single_stream / server); absent on offline runs, so not shown there
    ("latency.request_ms.p50", -1),
    ("latency.request_ms.p99", -1),
    ("latency.first_request_ms", -1),
    ("latency.achieved_qps", +1),
)
# quality.<name> direction by name; unknown quality keys are shown with no direction.
QUALITY_DIRECTION = {
    "accuracy": +1,
    "auc": +1,
    "f1": +1,
    "mae": -1,
    "rmse": -1,
    "nll": -1,
    "ece": -1,
    "brier": -1,
    "majority_rate": 0,
    "mae_of_mean": 0,
    "rows": 0,
}
# Tags that identify a run rather than its environment: never listed as explanations.
IDENTITY_TAGS = {"relflow.output_path", "relflow.error", "relflow.invalid_reasons"}
# Params that name outputs rather than change the workload.
IDENTITY_PARAMS = {"run.output_dir", "run.checkpoint"}

# Counts fixed by the spec and data: any difference is real, no noise to test against.
EXACT_METRICS = {K.TRAIN_UPDATES, K.TRAIN_UPDATES_PER_EPOCH, K.OUTPUT_BYTES_PER_ROW, K.QUALITY_ROWS}

NOT_ENOUGH = "not enough repeats"
BELOW_MDE = "below MDE"
CI_LABEL = "95% CI (order statistics)"


@dataclass(frozen=True)
class Estimate:
    """One side's figure for one metric."""

    value: float  # median (of repeats or of runs), or the single value
    low: float
    high: float
    samples: tuple[float, ...]  # per-run values (one per run)
    has_interval: bool  # low/high come from repeats or runs, not a single number

    @property
    def n_runs(self) -> int:
        return len(self.samples)


@dataclass(frozen=True)
class MetricRow:
    key: str
    direction: int
    baseline: Estimate
    candidate: Estimate
    ratio: float  # candidate / baseline (nan when undefined)
    method: str  # "Mann-Whitney U", CI_LABEL, "exact" (counts; or equal values), NOT_ENOUGH
    significant: bool
    p_value: float | None
    marked: bool  # significant AND beyond the threshold AND not below the MDE: a real change
    verdict: str  # improvement | regression | change | within noise | below threshold | below MDE | same | NOT_ENOUGH
    # minimum detectable effect (relative) of this comparison, from both sides' between-run CV
    # (tasks.measure.noise); NaN when a side has fewer than 2 runs
    mde: float = math.nan


@dataclass(frozen=True)
class Difference:
    key: str
    baseline: str
    candidate: str


@dataclass
class Comparison:
    baseline_label: str
    candidate_label: str
    baseline_runs: list[str]
    candidate_runs: list[str]
    threshold: float
    alpha: float
    rows: list[MetricRow] = field(default_factory=list)
    param_differences: list[Difference] = field(default_factory=list)
    tag_differences: list[Difference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def marked(self) -> list[MetricRow]:
        return [r for r in self.rows if r.marked]

    @property
    def regressions(self) -> list[MetricRow]:
        return [r for r in self.rows if r.marked and r.verdict == "regression"]


# --- statistics ---------------------------------------------------------------------


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> float:
    """Two-sided Mann-Whitney U p-value (scipy when installed; else exact/normal here)."""
    try:
        from scipy.stats import mannwhitneyu
    except ImportError:  # pragma: no cover - scipy is usually present
        return _mann_whitney_u(list(x), list(y))
    return float(mannwhitneyu(x, y, alternative="two-sided").pvalue)


def _mann_whitney_u(x: list[float], y: list[float]) -> float:
    """Own implementation: exact distribution for small samples without ties, else normal."""
    n1, n2 = len(x), len(y)
    allv = sorted((v, i) for i, v in enumerate(x + y))
    ranks = [0.0] * (n1 + n2)
    i, ties = 0, 0.0
    while i < len(allv):
        j = i
        while j + 1 < len(allv) and allv[j + 1][0] == allv[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[allv[k][1]] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    u1 = sum(ranks[:n1]) - n1 * (n1 + 1) / 2
    u = min(u1, n1 * n2 - u1)
    if ties == 0 and n1 + n2 <= 20:
        # counts[s] = number of arrangements with U == s (dynamic programme over sizes).

        @functools.cache
        def count(a: int, b: int, s: int) -> int:
            if s < 0:
                return 0
            if a == 0 or b == 0:
                return int(s == 0)
            return count(a - 1, b, s - b) + count(a, b - 1, s)

        total = math.comb(n1 + n2, n1)
        p = 2 * sum(count(n1, n2, s) for s in range(int(u) + 1)) / total
        return min(1.0, p)
    n = n1 + n2
    sigma = math.sqrt(n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))))
    if sigma == 0:
        return 1.0
    z = (abs(u1 - n1 * n2 / 2) - 0.5) / sigma
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


def min_rank_p(n1: int, n2: int) -> float:
    """Smallest two-sided p the Mann-Whitney U test can give for these sizes."""
    if n1 == 0 or n2 == 0:
        return 1.0
    return 2 / math.comb(n1 + n2, n1)


# --- estimates ----------------------------------------------------------------------


def run_value(run: RunRecord, key: str) -> float | None:
    """A run's figure: the median over its repeats when logged, else the plain value."""
    m = run.metrics
    if K.median(key) in m and m.get(K.REPEATS_MEASURED, 1) >= 2:
        return m[K.median(key)]
    return m.get(key)


def estimate(runs: Sequence[RunRecord], key: str) -> Estimate | None:
    pairs = [(r, v) for r in runs if (v := run_value(r, key)) is not None and math.isfinite(v)]
    if not pairs:
        return None
    if len(pairs) == 1:
        run, v = pairs[0]
        lo, hi = run.metrics.get(K.median_ci_low(key)), run.metrics.get(K.median_ci_high(key))
        if lo is not None and hi is not None:
            return Estimate(v, lo, hi, (v,), True)
        return Estimate(v, v, v, (v,), False)
    values = [v for _, v in pairs]
    iv = median_interval(values)
    if iv.has_interval:
        return Estimate(iv.median, iv.low, iv.high, tuple(values), True)
    return Estimate(iv.median, iv.median, iv.median, tuple(values), False)


def _ratio(a: float, b: float) -> float:
    if a == 0:
        return 1.0 if b == 0 else math.inf
    return b / a


def comparison_mde(base: Estimate, cand: Estimate, alpha: float) -> float:
    """The smallest relative change these two groups of runs can show (95% confidence at
    ``alpha`` 0.05, 80% power), from each side's between-run CV; NaN below 2 runs a side."""
    return mde_two(cv(base.samples), base.n_runs, cv(cand.samples), cand.n_runs, alpha=alpha)


def judge(key: str, direction: int, base: Estimate, cand: Estimate, *, threshold: float, alpha: float) -> MetricRow:
    ratio = _ratio(base.value, cand.value)
    row = _judge(key, direction, base, cand, ratio, threshold=threshold, alpha=alpha)
    if key in EXACT_METRICS:
        return row
    floor = comparison_mde(base, cand, alpha)
    if row.marked and math.isfinite(floor) and math.isfinite(ratio) and abs(ratio - 1.0) < floor:
        # Significant by the rank test, but smaller than these runs can reliably show: a
        # change this size is found by chance about as often as it is missed.
        return replace(row, marked=False, verdict=BELOW_MDE, mde=floor)
    return replace(row, mde=floor)


def _judge(
    key: str, direction: int, base: Estimate, cand: Estimate, ratio: float, *, threshold: float, alpha: float
) -> MetricRow:
    p = None
    if key in EXACT_METRICS or base.value == cand.value:
        changed = base.value != cand.value
        beyond = changed and abs(ratio - 1.0) > threshold
        verdict = (
            "same"
            if not changed
            else "below threshold"
            if not beyond
            else "change"
            if direction == 0
            else ("improvement" if (ratio > 1) == (direction > 0) else "regression")
        )
        return MetricRow(key, direction, base, cand, ratio, "exact", changed, None, beyond, verdict)
    if base.n_runs >= 2 and cand.n_runs >= 2 and min_rank_p(base.n_runs, cand.n_runs) <= alpha:
        method = "Mann-Whitney U"
        p = mann_whitney_u(base.samples, cand.samples)
        significant = p < alpha
        effect = ratio
    elif base.has_interval and cand.has_interval:
        method = CI_LABEL
        significant = base.high < cand.low or cand.high < base.low
        # The conservative ratio: the nearer edges of the two intervals.
        effect = (
            _ratio(base.high, cand.low)
            if cand.low > base.high
            else _ratio(base.low, cand.high)
            if cand.high < base.low
            else 1.0
        )
    else:
        method, significant, effect = NOT_ENOUGH, False, ratio
    beyond = math.isfinite(effect) and abs(effect - 1.0) > threshold or math.isinf(effect)
    marked = significant and beyond
    if method == NOT_ENOUGH:
        verdict = NOT_ENOUGH
    elif not significant:
        verdict = "within noise"
    elif not beyond:
        verdict = "below threshold"
    elif direction == 0:
        verdict = "change"
    else:
        verdict = "improvement" if (ratio > 1) == (direction > 0) else "regression"
    return MetricRow(key, direction, base, cand, ratio, method, significant, p, marked, verdict)


# --- explanations -------------------------------------------------------------------


def _common(runs: Sequence[RunRecord], attr: str, key: str) -> str:
    values = {getattr(r, attr).get(key, "(unset)") for r in runs}
    return values.pop() if len(values) == 1 else "(varies: " + ", ".join(sorted(values)) + ")"


def differences(
    base: Sequence[RunRecord], cand: Sequence[RunRecord], attr: str, keep=lambda k: True
) -> list[Difference]:
    """Keys whose (group-common) value differs between the sides."""
    keys = sorted({k for r in [*base, *cand] for k in getattr(r, attr) if keep(k)})
    out = []
    for k in keys:
        a, b = _common(base, attr, k), _common(cand, attr, k)
        if a != b or a.startswith("(varies"):
            out.append(Difference(k, a, b))
    return out


def environment_tag(key: str) -> bool:
    return key.startswith("relflow.") and key not in IDENTITY_TAGS


def compare(
    base: Sequence[RunRecord],
    cand: Sequence[RunRecord],
    *,
    threshold: float = 0.05,
    alpha: float = 0.05,
    baseline_label: str = "baseline",
    candidate_label: str = "candidate",
) -> Comparison:
    """Compare two runs or two groups of runs on the key metrics."""
    if not base or not cand:
        raise ValueError("compare needs at least one run on each side")
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    c = Comparison(
        baseline_label, candidate_label, [r.run_id for r in base], [r.run_id for r in cand], threshold, alpha
    )
    quality = sorted({k for r in [*base, *cand] for k in r.metrics if k.startswith("quality.") and k.count(".") == 1})
    keys = [*KEY_METRICS, *((k, QUALITY_DIRECTION.get(k.split(".", 1)[1], 0)) for k in quality)]
    for key, direction in keys:
        a, b = estimate(base, key), estimate(cand, key)
        if a is None or b is None:
            continue
        c.rows.append(judge(key, direction, a, b, threshold=threshold, alpha=alpha))
    c.param_differences = differences(base, cand, "params", lambda k: k not in IDENTITY_PARAMS)
    c.tag_differences = differences(base, cand, "tags", environment_tag)
    for side, runs in (("baseline", base), ("candidate", cand)):
        if len({r.tags.get("relflow.host_fingerprint") for r in runs}) > 1:
            c.notes.append(f"the {side} runs come from more than one host fingerprint")
        bad = [r.run_id[:8] for r in runs if r.tags.get("relflow.validity") == "INVALID"]
        if bad:
            c.notes.append(f"{side} has INVALID runs: {', '.join(bad)}")
        if len(runs) == 1 and runs[0].metrics.get(K.REPEATS_MEASURED, 1) < MIN_CI_SAMPLES:
            n = int(runs[0].metrics.get(K.REPEATS_MEASURED, 1))
            c.notes.append(
                f"the {side} run has {n} repeat(s), too few for a 95% interval: rerun "
                f"with --set run.repeats={MIN_CI_SAMPLES} (or compare groups of runs) "
                "to judge significance"
            )
    if all(r.method == NOT_ENOUGH for r in c.rows if r.key in K.REPEATED):
        c.notes.append("throughput has no spread on at least one side: nothing can be marked")
    return c


def split_by(
    runs: Sequence[RunRecord], selector: str, baseline: str, candidate: str | None = None
) -> tuple[list[RunRecord], list[RunRecord], str]:
    """Baseline / candidate groups by a tag (``KEY`` or ``tags.KEY``) or a param (``params.KEY``).

    Baseline: runs whose value equals ``baseline``. Candidate: runs whose value equals
    ``candidate``; when not given, the runs with any other value, which must be a single
    value (otherwise a ``UserError`` lists them). Runs without the key take no part.
    Returns (baseline, candidate, candidate value).
    """
    attr, key = (
        ("params", selector[len("params.") :])
        if selector.startswith("params.")
        else ("tags", selector.removeprefix("tags."))
    )
    with_key = [r for r in runs if key in getattr(r, attr)]
    base = [r for r in with_key if getattr(r, attr)[key] == baseline]
    others = sorted({getattr(r, attr)[key] for r in with_key} - {baseline})
    if candidate is None:
        if len(others) != 1:
            found = ", ".join(others) or "none"
            raise UserError(
                f"{selector}: the non-baseline runs have {len(others)} values ({found}); "
                "pick one with --candidate VALUE"
            )
        candidate = others[0]
    cand = [r for r in with_key if getattr(r, attr)[key] == candidate]
    return base, cand, candidate


def fmt_value(key: str, v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    if key.endswith("_bytes") or key.endswith(".bytes"):
        return f"{v / 2**20:,.1f} MiB"
    if key.endswith("seconds"):
        return f"{v:,.3f} s" if v >= 0.01 else f"{v * 1e3:,.2f} ms"
    if key.startswith("latency.") and ("_ms" in key):
        return f"{v:,.2f} ms"
    if abs(v) >= 1000 or (v == int(v) and abs(v) >= 1):
        return f"{v:,.0f}"
    return f"{v:.4g}"


def as_dict(c: Comparison) -> dict:
    """JSON-ready summary (for --json and for MLflow)."""
    return {
        "baseline": c.baseline_label,
        "candidate": c.candidate_label,
        "baseline_runs": c.baseline_runs,
        "candidate_runs": c.candidate_runs,
        "threshold": c.threshold,
        "alpha": c.alpha,
        "metrics": [
            {
                "key": r.key,
                "baseline": r.baseline.value,
                "baseline_ci": [r.baseline.low, r.baseline.high],
                "candidate": r.candidate.value,
                "candidate_ci": [r.candidate.low, r.candidate.high],
                "ratio": r.ratio,
                "method": r.method,
                "p_value": r.p_value,
                "marked": r.marked,
                "mde": r.mde if math.isfinite(r.mde) else None,
                "verdict": r.verdict,
            }
            for r in c.rows
        ],
        "param_differences": [d.__dict__ for d in c.param_differences],
        "tag_differences": [d.__dict__ for d in c.tag_differences],
        "notes": c.notes,
    }


__all__ = [
    "Comparison",
    "Difference",
    "Estimate",
    "KEY_METRICS",
    "MetricRow",
    "as_dict",
    "compare",
    "estimate",
    "fmt_value",
    "judge",
    "mann_whitney_u",
    "split_by",
]
