"""Baseline vs candidate: key metrics side by side, with ratios, marked only when real.

Pure functions from ``StoredRun``s to a ``Comparison`` (no MLflow, no printing).

A side is one run or a group of runs; **the unit of evidence is the independent run** (a
separate process). Passes inside one process share its allocator, caches, thread placement
and CPU frequency, so their spread is much smaller than the spread between processes
(eager predict ranged 3,528-6,353 rows/s between rounds of the compile-report while each
round's passes agreed to a few percent): they are never used to judge significance.

For each key metric a side yields an ``Estimate``: one sample per run
(``tasks.measure.significance.run_sample``: the run's repeat median when logged, which starts at
pass 1 because pass 0 holds the first call; else its value; ``relflow-bench noise`` takes its CV
over the same samples), the median over runs and, from 6 runs, the order-statistic 95% interval of that
median. A single run's in-process interval is shown for information only.

A change is **marked** only when both of these hold:

- the two-sided Mann-Whitney U test across runs (scipy, exact wherever the sizes allow),
  **Holm-corrected** over every metric tested in this comparison (its family: each metric with
  noise and 2+ runs a side, less any whose runs all logged one value), gives ``p_holm < alpha``.
  Holm controls the chance of any false mark across the whole table, which a per-metric
  ``alpha`` does not;
- the ratio of medians is beyond ``threshold`` (default 5%).

Next to each ratio: the comparison's **minimum detectable effect** (MDE: the shift at which this
rank test, at Holm's first step ``alpha / m``, rejects with 80% power given both sides'
between-run CV and run counts; ``tasks.measure.significance``). A marked change smaller than
its MDE stays marked, with the row flagged ``below_mde`` and a note: power is the chance of
finding a real change of a given size, not a false-positive rate (that is alpha, which Holm
holds), so it is no reason to withhold a mark the test made; but below the MDE the runs that
do reject tend to show the change larger than it is. (Vetoing the mark let one outlier, which
inflates the SD/mean CV while the rank test barely moves, hide a change every run showed.)

Where the run counts cannot reach Holm's first step at all (the smallest p the rank test can
give, ``2 / C(n_a + n_b, n_a)``, times the family size is not below ``alpha``: one run a side,
2 or 3 a side, 4 vs 4 with 2+ metrics, 5 vs 5 with 7+), the row says "not enough runs", the MDE
is none, and a note says how many runs a side could: "within noise" next to a finite MDE would
claim a test that was never possible. ``relflow-bench noise`` runs one configuration N times in
fresh processes; ``compare NOISE_PARENT_A NOISE_PARENT_B`` or ``compare --experiment E
--baseline KEY=VALUE`` compare such groups.

Counts fixed by the spec and data (train updates, output bytes per row, rows scored) have no
noise: any difference beyond the threshold is marked ("exact"). Figures of the rows scored
rather than of the system (``quality.majority_rate``, ``quality.mae_of_mean``: ``DATA_METRICS``)
are shown next to the quality they put in context and never tested or marked ("data"); nor is
a metric that every run of both sides logged at one value (its rank test cannot give p < 1:
"same"). Neither counts in Holm's family.

**Request runs** (single_stream, server) are judged per request: their latency first, and the
mean seconds of each step per request (``latency.step_ms.<step>.mean``) where offline runs show
the stage seconds. Their ``stage.<stage>.predict.seconds`` and ``quality.rows`` are sums over
however many requests the run served (a faster model that served more requests would read as a
regression), and their ``e2e.predict.rows_per_s`` is rows per second of service time, cold call
included: none of these is shown for them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dashboards.history import NOT_FOR_REQUEST_RUNS, request_run
from tasks.measure import keys as K
from tasks.measure.noise import cv
from tasks.measure.significance import holm, min_rank_p, rank_mde, rank_test_p, reachable, run_sample, runs_needed
from tasks.measure.stats import median_interval
from tasks.runtime.errors import UserError
from tasks.tracking.reader import StoredRun

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
    (K.latency_request_ms(50), -1),
    (K.latency_request_ms(99), -1),
    (K.LATENCY_FIRST_REQUEST_MS, -1),
    (K.LATENCY_ACHIEVED_QPS, +1),
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
    "unseen_class_rows": 0,
}
HOST_TAG = "relflow.host_fingerprint"
# The hardware the host fingerprint hashes (tasks/measure/environment.py), named when hosts differ.
HARDWARE_TAGS = ("relflow.cpu_model", "relflow.cpu_flags", "relflow.cpu_count", "relflow.ram_bytes", "relflow.gpu_name")
# Tags that identify a run rather than its environment: never listed as explanations.
IDENTITY_TAGS = {"relflow.output_path", "relflow.error", "relflow.invalid_reasons"}
# Params that name outputs rather than change the workload.
IDENTITY_PARAMS = {"run.output_dir", "run.checkpoint"}

# Counts fixed by the spec and data: any difference is real, no noise to test against.
EXACT_METRICS = {
    K.TRAIN_UPDATES,
    K.TRAIN_UPDATES_PER_EPOCH,
    K.OUTPUT_BYTES_PER_ROW,
    K.QUALITY_ROWS,
    K.QUALITY_UNSEEN_CLASS_ROWS,
}
# Figures of the rows scored, not of the system under test (the majority class's share, the
# error of predicting the mean): context for the quality next to them, never tested or marked.
DATA_METRICS = {K.quality("majority_rate"), K.quality("mae_of_mean")}
# Request runs: sums over however many requests the run served, never compared between runs
# (the stage seconds; quality.rows, the rows of every served request). Each step's mean per
# request stands where the stage seconds stand.
STAGE_SUMS = frozenset(K.stage_seconds(s, "predict") for s in K.STAGES)
REQUEST_SUMS = STAGE_SUMS | {K.QUALITY_ROWS, K.QUALITY_UNSEEN_CLASS_ROWS}
_STEP_MEAN = re.compile(r"^latency\.step_ms\.([^.]+)\.mean$")

NOT_ENOUGH = "not enough runs"
BELOW_MDE = "below MDE"  # a marked change smaller than its MDE: flagged, still marked
DATA = "data"  # method of DATA_METRICS rows: shown, never tested
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
    # RANK_TEST; "exact" (counts, or one value in every run of both sides); DATA (DATA_METRICS);
    # NOT_ENOUGH (no outcome could be marked)
    method: str
    significant: bool  # p_holm < alpha (rank test), or a count that differs (exact)
    p_value: float | None  # raw two-sided rank-test p (None where the test does not run)
    marked: bool  # significant AND beyond the threshold: a real change
    # improvement | regression | change | within noise | below threshold | same | data differs | NOT_ENOUGH
    verdict: str
    # minimum detectable effect (relative) of the rank test run here, from both sides' between-run
    # CV (tasks.measure.significance.rank_mde); inf where no outcome could be marked, NaN when a
    # side has fewer than 2 runs
    mde: float = math.nan
    p_holm: float | None = None  # p_value adjusted by Holm over the metrics tested in this comparison
    # marked, and smaller than the MDE: at this size a real change is found less than 4 times in
    # 5, and the runs that find it tend to show it larger than it is (a note says so)
    below_mde: bool = False


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
    tested_metrics: int = 0  # Holm's family: the metrics whose rank test ran

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


# --- estimates ----------------------------------------------------------------------


def estimate(runs: Sequence[StoredRun], key: str) -> Estimate | None:
    pairs = [(r, v) for r in runs if (v := run_sample(r.metrics, key)) is not None and math.isfinite(v)]
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


def key_metrics(metrics: Sequence[Mapping[str, float]]) -> list[tuple[str, int]]:
    """(key, direction) of every metric compare shows for runs that logged ``metrics``:
    ``KEY_METRICS`` and each run's top-level ``quality.<name>``. Request runs (every run a
    single_stream or server one) are judged per request: by their latency first, by each
    step's mean per request (``latency.step_ms.<step>.mean``) instead of the stage seconds, and
    not by the sums over the requests served (``REQUEST_SUMS``) nor by ``e2e.predict.rows_per_s``
    (service-time rows/s there, cold call included: not a throughput)."""
    quality = sorted({k for m in metrics for k in m if k.startswith("quality.") and k.count(".") == 1})
    rows = list(KEY_METRICS)
    if metrics and all(request_run(m) for m in metrics):
        logged = {g.group(1) for m in metrics for k in m if (g := _STEP_MEAN.match(k))}
        steps = [*K.STAGES, *sorted(logged - set(K.STAGES))]  # encode, with text columns
        latency = [(k, d) for k, d in rows if k.startswith(K.LATENCY_PREFIX)]
        rest: list[tuple[str, int]] = []
        for k, d in rows:
            if k == K.stage_seconds(K.STAGES[0], "predict"):  # the step means where the stage sums stood
                rest += [(K.latency_step_ms_mean(s), -1) for s in steps]
            if (k, d) not in latency and k not in NOT_FOR_REQUEST_RUNS and k not in REQUEST_SUMS:
                rest.append((k, d))
        rows = latency + rest
        quality = [k for k in quality if k not in REQUEST_SUMS]
    return [*rows, *((k, QUALITY_DIRECTION.get(k.split(".", 1)[1], 0)) for k in quality)]


def family_of_group(metrics: Sequence[Mapping[str, float]]) -> list[str]:
    """The metrics compare would test between this group of runs and another group of the
    same configuration: each metric with noise (not a count, not a data constant) that 2+ of
    these runs logged, at more than one value (a metric every run logged at one value is as
    constant in a second group of the configuration, and compare leaves it out). ``relflow-bench
    noise`` sizes Holm's family by it, so its MDE is the one a comparison of two such groups has."""
    family = []
    for key, _ in key_metrics(metrics):
        values = [v for m in metrics if (v := run_sample(m, key)) is not None and math.isfinite(v)]
        if key not in EXACT_METRICS and key not in DATA_METRICS and len(values) >= 2 and len(set(values)) > 1:
            family.append(key)
    return family


def in_family(key: str, base: Estimate, cand: Estimate) -> bool:
    """Whether the metric's rank test runs, and so counts in Holm's family: a metric with
    noise (not a count, not a data constant) with at least 2 runs a side, unless every run of
    both sides logged one value. Such a metric's rank test gives p = 1 whatever the labels
    (the test is conditional on the pooled values, and these have a single arrangement), so it
    can never be marked; counting it would only raise every other metric's Holm step (Tarone's
    rule: a test that cannot reach its level may leave the family without loosening the
    error rate). Everything else is decided by what was logged, never by the values."""
    if key in EXACT_METRICS or key in DATA_METRICS or base.n_runs < 2 or cand.n_runs < 2:
        return False
    return len({*base.samples, *cand.samples}) > 1


def comparison_mde(base: Estimate, cand: Estimate, alpha: float, family: int = 1) -> float:
    """The smallest relative change the rank test finds with 80% power between these two
    groups (each side's between-run CV and run count, Holm's first step over ``family``
    metrics; ``tasks.measure.significance.rank_mde``): inf where no outcome could be marked,
    NaN below 2 runs a side."""
    return rank_mde(cv(base.samples), base.n_runs, cv(cand.samples), cand.n_runs, family=family, alpha=alpha)


def judge(
    key: str,
    direction: int,
    base: Estimate,
    cand: Estimate,
    *,
    threshold: float,
    alpha: float,
    family: int = 1,
    p_value: float | None = None,
    p_holm: float | None = None,
) -> MetricRow:
    """One metric's row. ``family``: the metrics Holm corrects over in this comparison (this
    one included); ``p_value`` / ``p_holm``: its raw and Holm-adjusted rank-test p as
    ``compare`` computed them. Alone, the raw p is computed here and ``p_holm`` is Holm's
    first step, ``family * p``."""
    ratio = _ratio(base.value, cand.value)
    if key in EXACT_METRICS:
        return _exact(key, direction, base, cand, ratio, threshold)
    if key in DATA_METRICS:
        changed = base.value != cand.value
        return MetricRow(
            key, direction, base, cand, ratio, DATA, False, None, False, "data differs" if changed else "same"
        )
    floor = comparison_mde(base, cand, alpha, family)
    tested = in_family(key, base, cand)
    if tested and p_value is None:
        p_value = rank_test_p(base.samples, cand.samples)
    if p_value is not None and p_holm is None:
        p_holm = min(1.0, family * p_value)
    if not reachable(base.n_runs, cand.n_runs, family, alpha):
        # No outcome of these runs could reach Holm's first step: "within noise", or "same" for
        # equal medians, would claim a test that was never possible.
        return MetricRow(
            key, direction, base, cand, ratio, NOT_ENOUGH, False, p_value, False, NOT_ENOUGH, floor, p_holm
        )
    if not tested:  # reachable, so 2+ runs a side: every run of both logged one value
        return _exact(key, direction, base, cand, ratio, threshold)
    assert p_value is not None and p_holm is not None
    significant = p_holm < alpha
    beyond = (math.isfinite(ratio) and abs(ratio - 1.0) > threshold) or math.isinf(ratio)
    if base.value == cand.value:
        verdict = "same"  # the medians agree (significant or not: a ratio of 1 is never beyond)
    elif not significant:
        verdict = "within noise"
    elif not beyond:
        verdict = "below threshold"
    elif direction == 0:
        verdict = "change"
    else:
        verdict = "improvement" if (ratio > 1) == (direction > 0) else "regression"
    marked = significant and beyond
    # Significant, but smaller than the change this test finds with 80% power: still marked
    # (power is no false-positive rate; Holm holds that), flagged, since the runs that reject a
    # change below the MDE tend to show it larger than it is.
    below = marked and math.isfinite(floor) and math.isfinite(ratio) and abs(ratio - 1.0) < floor
    return MetricRow(
        key, direction, base, cand, ratio, RANK_TEST, significant, p_value, marked, verdict, floor, p_holm, below
    )


def _exact(key: str, direction: int, base: Estimate, cand: Estimate, ratio: float, threshold: float) -> MetricRow:
    """Counts fixed by the spec and data, or one value in every run of both sides: the
    difference is what it is."""
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


# --- explanations -------------------------------------------------------------------


def _common(runs: Sequence[StoredRun], attr: str, key: str) -> str:
    values = {getattr(r, attr).get(key, "(unset)") for r in runs}
    return values.pop() if len(values) == 1 else "(varies: " + ", ".join(sorted(values)) + ")"


def differences(
    base: Sequence[StoredRun], cand: Sequence[StoredRun], attr: str, keep=lambda k: True
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
    base: Sequence[StoredRun],
    cand: Sequence[StoredRun],
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
    pairs = [
        (key, d, a, b)
        for key, d in key_metrics([r.metrics for r in [*base, *cand]])
        if (a := estimate(base, key)) and (b := estimate(cand, key))
    ]
    # Holm's family: every metric whose rank test runs here, fixed by what was logged.
    family = [i for i, (key, _, a, b) in enumerate(pairs) if in_family(key, a, b)]
    raw = {i: rank_test_p(pairs[i][2].samples, pairs[i][3].samples) for i in family}
    adjusted = dict(zip(family, holm([raw[i] for i in family]), strict=True))
    c.tested_metrics = len(family)
    for i, (key, direction, a, b) in enumerate(pairs):
        c.rows.append(
            judge(
                key,
                direction,
                a,
                b,
                threshold=threshold,
                alpha=alpha,
                family=max(len(family), 1),
                p_value=raw.get(i),
                p_holm=adjusted.get(i),
            )
        )
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
        n_base, n_cand, m = len(base), len(cand), max(c.tested_metrics, 1)
        if min(n_base, n_cand) == 1:
            why = (
                "one run a side shows a ratio but cannot judge significance (passes inside one process "
                "are not independent samples)"
            )
        else:
            why = (
                f"the rank test's smallest two-sided p at these sizes, {min_rank_p(n_base, n_cand):.3g}, times "
                f"{m} tested metric(s) (Holm's first step) is not below alpha {alpha:g}: no outcome of these "
                f"runs could be marked; {runs_needed(m, alpha)} runs a side can"
            )
        c.notes.append(
            f"{n_base} vs {n_cand} independent run(s): {why}; run each configuration in fresh processes "
            f"(relflow-bench noise --runs {max(runs_needed(m, alpha), 6)}) and compare the groups "
            "(compare NOISE_PARENT_A NOISE_PARENT_B, or --experiment E --baseline KEY=VALUE)"
        )
    if c.tested_metrics and any(r.method == RANK_TEST for r in c.rows):
        c.notes.append(f"p-values Holm-corrected over {c.tested_metrics} tested metric(s)")
    below = [r for r in c.rows if r.below_mde]
    if below:
        c.notes.append(
            "marked below the MDE: "
            + ", ".join(f"{r.key} ({abs(r.ratio - 1):.1%} < MDE {r.mde:.1%})" for r in below)
            + "; the rank test finds a real change of this size less than 4 times in 5, so the runs that "
            "do find it tend to show it larger than it is: more runs a side narrow it"
        )
    return c


def split_by(
    runs: Sequence[StoredRun], selector: str, baseline: str, candidate: str | None = None
) -> tuple[list[StoredRun], list[StoredRun], str]:
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
    if key.startswith(K.LATENCY_PREFIX) and ("_ms" in key):
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
        "tested_metrics": c.tested_metrics,
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
                "below_mde": r.below_mde,
                "verdict": r.verdict,
            }
            for r in c.rows
        ],
        "param_differences": [d.__dict__ for d in c.param_differences],
        "tag_differences": [d.__dict__ for d in c.tag_differences],
        "notes": c.notes,
    }


__all__ = [
    "BELOW_MDE",
    "DATA_METRICS",
    "Comparison",
    "Difference",
    "Estimate",
    "KEY_METRICS",
    "MetricRow",
    "as_dict",
    "compare",
    "estimate",
    "family_of_group",
    "fmt_value",
    "judge",
    "split_by",
]
