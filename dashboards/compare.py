"""Baseline vs candidate: key metrics side by side, with ratios, marked only when real.

Pure functions from ``RunRecord``s to a ``Comparison`` (no MLflow, no printing).

A side is one run or a group of runs; **the unit of evidence is the independent run** (a
separate process). Passes inside one process share its allocator, caches, thread placement
and CPU frequency, so their spread is much smaller than the spread between processes
(eager predict ranged 3,528-6,353 rows/s between rounds of the compile-report while each
round's passes agreed to a few percent): they are never used to judge significance.

For each key metric a side yields an ``Estimate``: one sample per run (the run's repeat
median when logged, which starts at pass 1 because pass 0 holds the first call; else its
value), the median over runs and, from 6 runs, the order-statistic 95% interval of that
median. A single run's in-process interval is shown for information only.

A change is **marked** only when all of these hold:

- both sides have enough independent runs for the two-sided Mann-Whitney U test to reach
  ``alpha`` (4 vs 4 is the smallest that can) and the test, **Holm-corrected** over every
  metric tested in this comparison, gives ``p_holm < alpha``. Holm controls the chance of any
  false mark across the whole table, which a per-metric ``alpha`` does not;
- the ratio of medians is beyond ``threshold`` (default 5%);
- the ratio is not smaller than the comparison's **minimum detectable effect** (MDE, from
  both sides' between-run CV and run counts, ``tasks.measure.noise``: the smallest change
  these runs detect at 95% confidence with 80% power), else "below MDE".

Otherwise the ratio is printed with "not enough independent runs" and nothing is claimed: one
run against one run can show a ratio but cannot judge it. ``relflow-bench noise`` runs one
configuration N times in fresh processes; ``compare NOISE_PARENT_A NOISE_PARENT_B`` or
``compare --experiment E --baseline KEY=VALUE`` compare such groups.

Counts fixed by the spec and data (train updates, output bytes per row) have no noise: any
difference beyond the threshold is marked ("exact").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from tasks.measure import keys as K
from tasks.measure.noise import cv, mde_two
from tasks.measure.stats import median_interval
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
HOST_TAG = "relflow.host_fingerprint"
# The hardware the host fingerprint hashes (tasks/measure/environment.py), named when hosts differ.
HARDWARE_TAGS = ("relflow.cpu_model", "relflow.cpu_flags", "relflow.cpu_count", "relflow.ram_bytes", "relflow.gpu_name")
# Tags that identify a run rather than its environment: never listed as explanations.
IDENTITY_TAGS = {"relflow.output_path", "relflow.error", "relflow.invalid_reasons"}
# Params that name outputs rather than change the workload.
IDENTITY_PARAMS = {"run.output_dir", "run.checkpoint"}

# Counts fixed by the spec and data: any difference is real, no noise to test against.
EXACT_METRICS = {K.TRAIN_UPDATES, K.TRAIN_UPDATES_PER_EPOCH, K.OUTPUT_BYTES_PER_ROW, K.QUALITY_ROWS}

NOT_ENOUGH = "not enough independent runs"
BELOW_MDE = "below MDE"
RANK_TEST = "Mann-Whitney U"
CORRECTION = "holm"


@dataclass(frozen=True)
class Estimate:
    """One side's figure for one metric."""

    value: float  # median over runs (a run's value is its repeat median when logged)
    low: float
    high: float
    samples: tuple[float, ...]  # per-run values (one per independent run)
    # low/high are an interval, not a single number: over runs (>= 6), or, for a single run,
    # over its in-process passes (shown, never used for significance)
    has_interval: bool

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
    method: str  # RANK_TEST, "exact" (counts; or equal values), NOT_ENOUGH
    significant: bool  # p_holm < alpha (rank test), or a count that differs (exact)
    p_value: float | None  # raw two-sided rank-test p
    marked: bool  # significant AND beyond the threshold AND not below the MDE: a real change
    verdict: str  # improvement | regression | change | within noise | below threshold | below MDE | same | NOT_ENOUGH
    # minimum detectable effect (relative) of this comparison, from both sides' between-run CV
    # (tasks.measure.noise); NaN when a side has fewer than 2 runs
    mde: float = math.nan
    p_holm: float | None = None  # p_value adjusted by Holm over the metrics tested in this comparison


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
    def baseline_independent_runs(self) -> int:
        return len(self.baseline_runs)

    @property
    def candidate_independent_runs(self) -> int:
        return len(self.candidate_runs)

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


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, in the input order (monotone, capped at 1)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def testable(base: Estimate, cand: Estimate, alpha: float) -> bool:
    """Enough independent runs a side for the rank test to reach ``alpha`` at all."""
    return base.n_runs >= 2 and cand.n_runs >= 2 and min_rank_p(base.n_runs, cand.n_runs) <= alpha


def judge(
    key: str,
    direction: int,
    base: Estimate,
    cand: Estimate,
    *,
    threshold: float,
    alpha: float,
    p_holm: float | None = None,
) -> MetricRow:
    """One metric's row. ``p_holm`` is the Holm-adjusted p of this metric's rank test within
    its comparison (``compare`` supplies it); alone, a metric is its own family (raw p)."""
    ratio = _ratio(base.value, cand.value)
    row = _judge(key, direction, base, cand, ratio, threshold=threshold, alpha=alpha, p_holm=p_holm)
    if key in EXACT_METRICS:
        return row
    floor = comparison_mde(base, cand, alpha)
    if row.marked and math.isfinite(floor) and math.isfinite(ratio) and abs(ratio - 1.0) < floor:
        # Significant by the rank test, but smaller than these runs can reliably show: a
        # change this size is found by chance about as often as it is missed.
        return replace(row, marked=False, verdict=BELOW_MDE, mde=floor)
    return replace(row, mde=floor)


def _judge(
    key: str,
    direction: int,
    base: Estimate,
    cand: Estimate,
    ratio: float,
    *,
    threshold: float,
    alpha: float,
    p_holm: float | None,
) -> MetricRow:
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
    if not testable(base, cand, alpha):
        return MetricRow(key, direction, base, cand, ratio, NOT_ENOUGH, False, None, False, NOT_ENOUGH)
    p = mann_whitney_u(base.samples, cand.samples)
    adjusted = p if p_holm is None else p_holm
    significant = adjusted < alpha
    beyond = (math.isfinite(ratio) and abs(ratio - 1.0) > threshold) or math.isinf(ratio)
    marked = significant and beyond
    if not significant:
        verdict = "within noise"
    elif not beyond:
        verdict = "below threshold"
    elif direction == 0:
        verdict = "change"
    else:
        verdict = "improvement" if (ratio > 1) == (direction > 0) else "regression"
    return MetricRow(key, direction, base, cand, ratio, RANK_TEST, significant, p, marked, verdict, p_holm=adjusted)


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
    pairs = [(key, d, a, b) for key, d in keys if (a := estimate(base, key)) and (b := estimate(cand, key))]
    # The family Holm corrects over: every metric whose rank test runs in this comparison.
    tested = [
        i
        for i, (key, _, a, b) in enumerate(pairs)
        if key not in EXACT_METRICS and a.value != b.value and testable(a, b, alpha)
    ]
    adjusted = dict(
        zip(tested, holm([mann_whitney_u(pairs[i][2].samples, pairs[i][3].samples) for i in tested]), strict=True)
    )
    for i, (key, direction, a, b) in enumerate(pairs):
        c.rows.append(judge(key, direction, a, b, threshold=threshold, alpha=alpha, p_holm=adjusted.get(i)))
    c.param_differences = differences(base, cand, "params", lambda k: k not in IDENTITY_PARAMS)
    c.tag_differences = differences(base, cand, "tags", environment_tag)
    hosts = {side: {r.tags.get(HOST_TAG) for r in runs} for side, runs in (("baseline", base), ("candidate", cand))}
    if hosts["baseline"] != hosts["candidate"]:
        unlike = [d for d in c.tag_differences if d.key in HARDWARE_TAGS]
        c.notes.append(
            "baseline and candidate ran on unlike hosts (relflow.host_fingerprint differs"
            + (": " + "; ".join(f"{d.key} {d.baseline} vs {d.candidate}" for d in unlike) if unlike else "")
            + "): every ratio mixes the hardware with the change"
        )
    for side, runs in (("baseline", base), ("candidate", cand)):
        if len(hosts[side]) > 1:
            c.notes.append(f"the {side} runs come from more than one host fingerprint")
        bad = [r.run_id[:8] for r in runs if r.tags.get("relflow.validity") == "INVALID"]
        if bad:
            c.notes.append(f"{side} has INVALID runs: {', '.join(bad)}")
    if any(r.method == NOT_ENOUGH for r in c.rows):
        n_base, n_cand = len(base), len(cand)
        c.notes.append(
            f"{n_base} vs {n_cand} independent run(s): "
            + (
                "one run a side shows a ratio but cannot judge significance (passes inside one process "
                "are not independent samples)"
                if min(n_base, n_cand) == 1
                else "too few for the rank test to reach alpha"
            )
            + "; run each configuration in fresh processes (relflow-bench noise --runs 6) and compare the groups "
            "(compare NOISE_PARENT_A NOISE_PARENT_B, or --experiment E --baseline KEY=VALUE)"
        )
    if c.rows and any(r.method == RANK_TEST for r in c.rows):
        n_tests = sum(r.method == RANK_TEST for r in c.rows)
        c.notes.append(f"p-values Holm-corrected over {n_tests} tested metric(s)")
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
        "baseline_independent_runs": c.baseline_independent_runs,
        "candidate_independent_runs": c.candidate_independent_runs,
        "threshold": c.threshold,
        "alpha": c.alpha,
        "correction": CORRECTION,
        "metrics": [
            {
                "key": r.key,
                "baseline": r.baseline.value,
                "baseline_ci": [r.baseline.low, r.baseline.high],
                "candidate": r.candidate.value,
                "candidate_ci": [r.candidate.low, r.candidate.high],
                "baseline_runs": r.baseline.n_runs,
                "candidate_runs": r.candidate.n_runs,
                "ratio": r.ratio,
                "method": r.method,
                "p_value": r.p_value,
                "p_holm": r.p_holm,
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
    "holm",
    "judge",
    "mann_whitney_u",
    "split_by",
]
