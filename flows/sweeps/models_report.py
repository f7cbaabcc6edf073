"""The models under test side by side: ``relflow-bench models-report SPEC``.

Each registered library (``model.library``: ``reference``, ``relflow``, ``relational_transformers``,
``lightgbm``; ``tasks/libraries`` ``LIBRARIES``) runs the same spec and data as a full ``relflow-bench run`` with
``--set model.library=<lib>`` in a fresh process (``flows/sweeps/launch.py``), interleaved
round by round with the order rotated (as ``backends-report``), children tagged
``relflow.variant`` (the library) and ``relflow.round`` under one parent MLflow run, which
holds the table (``models_report.json`` / ``.md``).

Columns: the headline quality with its 95% interval (``quality.<headline>.ci_low|ci_high``: each
run's bootstrap over its scored rows, resampling test entities for a RelBench task and root
rows otherwise, tasks/measure/quality.py; with several rounds, the median of each bound over
them) next to its baseline (``quality.majority_rate`` for category and binary,
``quality.mae_of_mean`` for regression). A RelBench task's binary or regression quality is
RelBench's own figure instead (``relbench.<metric>`` with ``relbench.<metric>.ci_low|ci_high``,
tasks/run/record/relbench_scores.py) next to the stronger of its two baselines
(``quality.baseline.train_mean|previous.<metric>``). Then ``quality.rows`` (the held-out rows
scored: the same rows for every library, as a class one library never learned counts as a wrong
prediction; when the libraries' rows differ anyway, quality is not compared: the cell says so
and a note names the rows), for category and binary the held-out NLL of the model's own
probabilities and after temperature scaling (``quality.uncalibrated.nll`` -> ``quality.nll``:
accuracy alone hides a model that ranks right but is barely confident, as relflow after one
epoch), e2e predict rows/s, steady rows/s, first call s, batch p99 ms, peak RSS (the median
over rounds of each run's peak), parameters (param ``model.parameters``) and **e2e vs
reference**: the median over rounds of the library's ``e2e.predict.rows_per_s`` over the
reference model's in the same round (``tasks/measure/report.py`` ``ratio_interval``, as
backends-report's "e2e vs eager"), with its 95% interval from 6 paired rounds. Every figure is
a median over the library's **VALID** rounds only (an INVALID run's figures are the ones the
harness calls untrustworthy; a FAILED one has none): the table says how many of its rounds were
VALID, and a note names the INVALID rounds' reasons. A library that refuses the spec (its ``check``,
exit 2) is a row saying why: the parent asks each library's check first (it imports no
library, about a second), and a child that still exits 2 with a refusal ("model.library <lib>
cannot honour ...", the message shape of every library's check and of the harness's) is
recorded the same way. A child that exits 2 for anything else (bad data, a missing file: input
the user can fix, not a setting the library cannot honour) is a ``DATA ERROR`` row with its
message, never "refused".

A second table is the **cost per prediction** of the predict phase (medians over VALID rounds of
each run's ``1000 x seconds / e2e.predict.rows``): end to end and per stage (retrieve,
preprocess, encode, tensorize, compute, calibrate, write; ``-`` where the library has no such
step), the predict MFU (``compute.mfu``, present coordinates) and the tensorize and compute
stages against their floors (``floor.<stage>.fraction``, tasks/run/floors.py). A figure that
does not exist for a library says so instead of a number: ``none: no FLOPs`` where its runs tag
``relflow.flops_note`` (relflow packs, LightGBM's trees compare; a note quotes each reason) and
``none: no model floor`` where ``Library.model_floors`` is false (the floors are the reference
model's tensors and GEMMs), ``none: one pass (no warm figure)`` for tensorize in runs of one
predict pass (it is set against its floor by the passes after the first); a fraction whose
floors are untrusted (tasks/measure/floor_trust.py) is starred, with a note.

``--include-busy-host`` also takes the figures of rounds INVALID *only* because other processes
used the cores (every reason ``host.other_cpu_fraction[_before] > run.max_host_load``: the run's
own work was measured as a VALID one's, on a loaded host): on a shared host they are the only
figures there are. Such rounds stay INVALID in the table (``VALID rounds`` counts VALID ones
only), and a note says how many of each library's figures stand on them; a round INVALID for
anything else (a short steady window, a recompile, quality) never counts.

``--library-set LIB:KEY=VALUE`` gives one library overrides of its own, after ``--set`` (e.g. a
library too fast for the steady window in one pass: ``lightgbm:run.repeats=16``); a note names
them, and another says when the libraries' runs made different numbers of predict passes
(``e2e.predict.passes``: each run's e2e figures are over all of its passes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import cast

from tasks.libraries import DEFAULT_LIBRARY
from tasks.libraries import LIBRARIES as REGISTERED
from tasks.measure import keys as K
from tasks.measure.floor_trust import untrusted as floors_untrusted
from tasks.measure.report import Cell, Group, Sample, interval_text, markdown_table, ratio_interval
from tasks.measure.report import summarize as summarize_groups
from tasks.measure.stats import median_interval

LIBRARIES: tuple[str, ...] = tuple(REGISTERED)  # every registered library, in the registry's order
REFERENCE_LIBRARY = DEFAULT_LIBRARY  # the denominator of "e2e vs reference": the model in model/
ROUND_TAG = "relflow.round"  # the same tag backends-report puts on its children
VARIANT_TAG = "relflow.variant"
PARAMETERS_PARAM = "model.parameters"
REFUSED = "REFUSED"  # the validity of a library whose check refused the spec (exit 2)
DATA_ERROR = "DATA ERROR"  # a child's exit 2 that is not a refusal: bad input the user can fix
# The headline quality's baseline: what a model that learned nothing scores.
BASELINE = {"category": "majority_rate", "binary": "majority_rate", "regression": "mae_of_mean"}
# A RelBench task's own metric per task kind (relbench scores binary and regression only) and
# its direction (tasks/run/record/relbench_scores.py HIGHER_IS_BETTER, repeated: that module
# imports pandas and polars, this one stays light for the CLI's flag checks).
RELBENCH_METRIC = {"binary": "roc_auc", "regression": "nmae"}
RELBENCH_HIGHER_IS_BETTER = {"roc_auc": True, "nmae": False}
VALID = "VALID"
INVALID = "INVALID"
# The validity rule of the host's load (tasks/run/record/validity.py): the keys its reasons start with.
HOST_LOAD_KEYS = (K.HOST_OTHER_CPU_FRACTION_BEFORE, K.HOST_OTHER_CPU_FRACTION)
# The predict stages of the cost table, with an encode step (text columns; relational-transformers'
# cell vectors) in its place: the stage columns of the budget's table (flows/sweeps/budget.py).
PREDICT_STAGES = ("retrieve", "preprocess", "encode", "tensorize", "compute", "calibrate", "write")
MODEL_FLOOR_STAGES = ("tensorize", "compute")  # the floors a library has when Library.model_floors
FLOPS_NOTE_TAG = "relflow.flops_note"  # why a library's runs publish no FLOPs (so no MFU)
NO_FLOPS = "none: no FLOPs"
NO_MODEL_FLOOR = "none: no model floor"
# tensorize is set against its floor by the warm passes' bytes and seconds (tasks/run/floors.py):
# a run of one predict pass has no warm figure, so no fraction
WARM_FLOOR_STAGES = ("tensorize",)
NO_WARM_PASS = "none: one pass (no warm figure)"


@dataclass(frozen=True)
class Headline:
    """What the quality cell shows: a figure, its interval's keys, the baselines beside it (the
    cell shows the stronger one) and how it is named in the header."""

    name: str
    key: str
    low: str
    high: str
    baselines: dict[str, str]  # baseline name -> metric key
    higher_is_better: bool
    baseline_label: str


def headline(kind: str, relbench: bool = False) -> Headline:
    """The harness's headline quality (``quality.<name>``) and its baseline; for a RelBench task
    of a kind relbench scores, ``relbench.<metric>`` and its two baselines."""
    low, high = K.QUALITY_CI_BOUNDS
    metric = RELBENCH_METRIC.get(kind) if relbench else None
    if metric is not None:
        return Headline(
            K.relbench(metric),
            K.relbench(metric),
            K.relbench_ci(metric, low),
            K.relbench_ci(metric, high),
            {b: K.quality_baseline(b, metric) for b in K.BASELINES},
            RELBENCH_HIGHER_IS_BETTER[metric],
            "stronger baseline",
        )
    name, base = K.HEADLINE_QUALITY[kind], BASELINE[kind]
    return Headline(
        name,
        K.quality(name),
        K.quality_ci(name, low),
        K.quality_ci(name, high),
        {base: K.quality(base)},
        kind != "regression",
        base,
    )


def parse_libraries(text: str | None) -> list[str]:
    """``--libraries a,b,c`` -> the libraries, in that order; ValueError naming the problem."""
    if text is None:
        return list(LIBRARIES)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--libraries is empty; choose from {', '.join(LIBRARIES)}.")
    unknown = [n for n in names if n not in LIBRARIES]
    if unknown:
        raise ValueError(f"--libraries {unknown} unknown; choose from {', '.join(LIBRARIES)}.")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"--libraries names {dupes} more than once.")
    return names


def parse_library_sets(texts: Sequence[str] | None, libraries: Sequence[str]) -> dict[str, list[str]]:
    """``--library-set LIB:KEY=VALUE`` (repeatable) -> each library's own overrides, in the order
    given; ValueError naming the problem (no ``LIB:``, no ``KEY=VALUE``, a library not run)."""
    out: dict[str, list[str]] = {}
    for text in texts or []:
        lib, sep, override = text.partition(":")
        lib = lib.strip()
        if not sep or "=" not in override or not override.partition("=")[0].strip():
            raise ValueError(f"--library-set {text!r} is not LIB:KEY=VALUE (e.g. lightgbm:run.repeats=16).")
        if lib not in libraries:
            raise ValueError(
                f"--library-set {text!r}: {lib!r} is not a library this report runs ({', '.join(libraries)})."
            )
        out.setdefault(lib, []).append(override.strip())
    return out


def round_order(libraries: Sequence[str], r: int) -> list[str]:
    """Round ``r``'s order: rotated by one per round, so no library always runs first."""
    k = r % len(libraries) if libraries else 0
    return [*libraries[k:], *libraries[:k]]


def is_refusal(library: str, error: str) -> bool:
    """Whether a child's exit-2 message is ``library`` refusing a setting (the shape of
    ``Refusal.message`` and ``Unsupported.message``), rather than bad input."""
    return f"model.library {library} cannot honour " in error


def valid_only(g: Group) -> Group:
    """The group's VALID rounds: the only ones its figures come from."""
    return Group(g.key, tuple(s for s in g.samples if s.validity == VALID))


def busy_host_only(s: Sample) -> bool:
    """An INVALID round whose every reason is the host's load (``host.other_cpu_fraction[_before]
    > run.max_host_load``): other processes used the cores, its own work was measured."""
    if s.validity != INVALID or s.report is None or not s.report.invalid_reasons:
        return False
    return all(reason.split(" ", 1)[0] in HOST_LOAD_KEYS for reason in s.report.invalid_reasons)


def ms_per_prediction(m: Mapping[str, float], seconds_key: str) -> float | None:
    """``1000 x m[seconds_key] / e2e.predict.rows``: a predict figure's milliseconds per
    prediction; None when the run has no such figure (a stage the library does not run)."""
    seconds, rows = m.get(seconds_key), m.get(K.E2E_PREDICT_ROWS)
    if seconds is None or math.isnan(seconds) or not rows:
        return None
    return 1000.0 * seconds / rows


def has_model_floors(library: str) -> bool:
    """Whether ``library`` has the tensorize and compute floors (``Library.model_floors``;
    its light module only). A name not registered: True, so its absent figures read ``-``."""
    if library not in REGISTERED:
        return True
    from tasks.libraries import library_named

    return library_named(library).model_floors


def summarize(
    samples: Sequence[Sample],
    kind: str,
    refused: Mapping[str, str] | None = None,
    parameters: Mapping[str, float] | None = None,
    data_errors: Mapping[str, str] | None = None,
    relbench: bool = False,
    library_overrides: Mapping[str, Sequence[str]] | None = None,
    include_busy_host: bool = False,
) -> list[dict[str, Cell]]:
    """One row per library: medians over its VALID rounds; a refused library's row holds its
    reason, as does a library whose child exited 2 on bad input (``data_errors``).

    ``parameters``: ``model.parameters`` by child run id (a param, not in the run's summary);
    ``relbench``: the spec is a RelBench task (its quality cell is ``relbench.<metric>``);
    ``library_overrides``: each library's own ``--library-set`` overrides (kept in its row);
    ``include_busy_host``: the rounds INVALID only for the host's load count too (``busy_host_only``)."""
    h = headline(kind, relbench)
    refused = dict(refused or {})
    data_errors = dict(data_errors or {})
    parameters = dict(parameters or {})
    overrides = {lib: list(o) for lib, o in (library_overrides or {}).items()}

    def counts(s: Sample) -> bool:
        """Whether the round's figures count: VALID, or (include_busy_host) INVALID only for load."""
        return s.validity == VALID or (include_busy_host and busy_host_only(s))

    def counted(g: Group) -> Group:
        return Group(g.key, tuple(s for s in g.samples if counts(s)))

    def e2e_by_round(of: Sequence[Sample]) -> dict[int, float]:
        return {
            s.round: s.metrics[K.E2E_PREDICT_ROWS_PER_S]
            for s in of
            if s.round >= 0 and counts(s) and K.E2E_PREDICT_ROWS_PER_S in s.metrics
        }

    ref_e2e = e2e_by_round([s for s in samples if s.variant == REFERENCE_LIBRARY])

    def vs_ref(g: Group, field: str) -> float | None:
        ri = ratio_interval(e2e_by_round(g.samples), ref_e2e)
        if ri is None:
            return math.nan if field == "median" else None
        return getattr(ri, field)

    def params(g: Group) -> float:
        vals = sorted(parameters[r.run_id] for r in counted(g).reports if r.run_id in parameters)
        return vals[len(vals) // 2] if vals else math.nan

    def baseline(g: Group) -> tuple[str, float]:
        """The stronger baseline (its median over its counted rounds), and its name."""
        got = [(name, counted(g).median(key)) for name, key in h.baselines.items()]
        got = [(n, v) for n, v in got if not math.isnan(v)]
        if not got:
            return next(iter(h.baselines)), math.nan
        return (max if h.higher_is_better else min)(got, key=lambda nv: nv[1])

    def invalid_reasons(g: Group) -> list[str]:
        seen: dict[str, None] = {}
        for r in g.reports:
            if r.validity != VALID:
                seen |= dict.fromkeys(r.invalid_reasons or [r.validity])
        return list(seen)

    def v(key: str) -> Callable[[Group], float]:
        return lambda g: counted(g).median(key)

    def ms(key: str) -> Callable[[Group], float]:
        """The median over its counted rounds of each run's milliseconds per prediction of ``key``."""

        def of(g: Group) -> float:
            vals = [x for r in counted(g).reports if (x := ms_per_prediction(r.metrics, key)) is not None]
            return median_interval(vals).median if vals else math.nan

        return of

    def flops_note(g: Group) -> str:
        """Why the library's counted runs publish no FLOPs (their ``relflow.flops_note``), if they say."""
        return next((n for r in counted(g).reports if (n := r.tags.get(FLOPS_NOTE_TAG))), "")

    def floors_untrusted_reasons(g: Group) -> list[str]:
        seen: dict[str, None] = {}
        for r in counted(g).reports:
            if any(K.floor_fraction(st) in r.metrics for st in MODEL_FLOOR_STAGES):
                seen |= dict.fromkeys(floors_untrusted(r.metrics))
        return list(seen)

    ran = [s for s in samples if s.variant not in refused and s.variant not in data_errors]
    rows = summarize_groups(
        ran,
        {
            "rounds": lambda g: len(g.samples),
            "valid_rounds": lambda g: len(valid_only(g).samples),
            "busy_rounds_counted": lambda g: len(counted(g).samples) - len(valid_only(g).samples),
            "failed_rounds": lambda g: len(g.samples) - len(g.reports),
            "quality": v(h.key),
            "quality_ci_low": v(h.low),
            "quality_ci_high": v(h.high),
            "baseline": lambda g: baseline(g)[1],
            "baseline_name": lambda g: baseline(g)[0],
            "quality_rows": v(K.QUALITY_ROWS),
            "quality_rows_min": lambda g: min(counted(g).values(K.QUALITY_ROWS), default=math.nan),
            "quality_rows_max": lambda g: counted(g).max(K.QUALITY_ROWS),
            "quality_compared": lambda g: True,
            "nll_uncalibrated": v(K.quality("uncalibrated.nll")),
            "nll": v(K.quality("nll")),
            "e2e_predict_rows_per_s": v(K.E2E_PREDICT_ROWS_PER_S),
            "e2e_vs_reference": lambda g: vs_ref(g, "median"),
            "e2e_vs_reference_ci_low": lambda g: vs_ref(g, "low"),
            "e2e_vs_reference_ci_high": lambda g: vs_ref(g, "high"),
            "e2e_vs_reference_rounds": lambda g: vs_ref(g, "n"),
            "steady_rows_per_s": v(K.STEADY_ROWS_PER_S),
            "first_call_s": v(K.FIRST_CALL_SECONDS),
            "batch_p99_ms": v(K.compute("predict", "batch_ms.p99")),
            "peak_rss_mib": lambda g: counted(g).median(K.HOST_PEAK_BYTES) / 2**20,  # median of each run's peak
            "parameters": params,
            "predict_passes": v(K.E2E_PREDICT_PASSES),
            "e2e_ms_per_prediction": ms(K.E2E_PREDICT_SECONDS),
            **{f"{st}_ms_per_prediction": ms(K.stage_seconds(st, "predict")) for st in PREDICT_STAGES},
            K.MFU: v(K.compute("predict", K.MFU)),
            "flops_note": flops_note,
            **{f"floor_{st}": v(K.floor_fraction(st)) for st in MODEL_FLOOR_STAGES},
            "model_floors": lambda g: has_model_floors(g.key[0]),
            "floors_untrusted": floors_untrusted_reasons,
            "overrides": lambda g: overrides.get(g.key[0], []),
            "validity": lambda g: ",".join(sorted({s.validity for s in g.samples})),
            "invalid_reasons": invalid_reasons,
            "reason": lambda g: "",
            "run_ids": lambda g: [s.run_id for s in g.samples],
        },
    )
    # One set of held-out rows or no comparison: every VALID round of every library scored the
    # same number of rows (a library that dropped rows, or scored others, is not comparable).
    seen = {s.metrics[K.QUALITY_ROWS] for s in ran if counts(s) and K.QUALITY_ROWS in s.metrics}
    if len(seen) > 1:
        for r in rows:
            r["quality_compared"] = False
    rows += [
        {"variant": lib, "rounds": 0, "validity": REFUSED, "reason": why, "overrides": overrides.get(lib, [])}
        for lib, why in refused.items()
    ]
    rows += [
        {"variant": lib, "rounds": 0, "validity": DATA_ERROR, "reason": why, "overrides": overrides.get(lib, [])}
        for lib, why in data_errors.items()
    ]
    return rows


def _num(v: Cell, fmt: str) -> str:
    return "-" if not isinstance(v, int | float) or math.isnan(v) else f"{v:{fmt}}"


def _vs_ref_text(r: Mapping[str, Cell]) -> str:
    ratio = r.get("e2e_vs_reference")
    if not isinstance(ratio, float) or math.isnan(ratio):
        return "-"  # no round where both this library and the reference finished
    n, low, high = r["e2e_vs_reference_rounds"], r["e2e_vs_reference_ci_low"], r["e2e_vs_reference_ci_high"]
    bounds = (low, high) if isinstance(low, float) and isinstance(high, float) else (None, None)
    return f"{ratio:.2f}x [{interval_text(*bounds, int(n) if isinstance(n, int | float) else 0, '.2f')}]"


def _quality_text(r: Mapping[str, Cell], relbench: bool = False) -> str:
    """``value [low, high] (baseline)``; without an interval (none logged) ``value (baseline)``;
    a RelBench cell names its baseline (``(previous 0.5123)``). Rows that differ between the
    libraries: no figure (``not compared``, the note under the table says why)."""
    if r.get("quality_compared") is False:
        return "not compared: quality.rows differ"
    low, high = r.get("quality_ci_low"), r.get("quality_ci_high")
    ci = (
        f" [{low:.4f}, {high:.4f}]"
        if isinstance(low, float) and isinstance(high, float) and not (math.isnan(low) or math.isnan(high))
        else ""
    )
    base = _num(r.get("baseline"), ".4f")
    named = f"{r.get('baseline_name')} {base}" if relbench and base != "-" else base
    return f"{_num(r['quality'], '.4f')}{ci} ({named})"


def _nll_text(r: Mapping[str, Cell]) -> str:
    raw, calibrated = _num(r.get("nll_uncalibrated"), ".4f"), _num(r.get("nll"), ".4f")
    return "-" if raw == calibrated == "-" else f"{raw} -> {calibrated}"


def _rows_range(r: Mapping[str, Cell]) -> str:
    """A library's quality.rows over its VALID rounds: one figure, or ``low-high`` when they vary."""
    low, high = _num(r.get("quality_rows_min"), ",.0f"), _num(r.get("quality_rows_max"), ",.0f")
    return low if low == high else f"{low}-{high}"


def _percent(v: Cell) -> str:
    return "-" if not isinstance(v, int | float) or math.isnan(v) else f"{100 * v:.1f}%"


def _mfu_text(r: Mapping[str, Cell]) -> str:
    """The predict MFU; ``none: no FLOPs`` where the library's runs say why they have none."""
    text = _percent(r.get(K.MFU))
    return NO_FLOPS if text == "-" and r.get("flops_note") else text


def _floor_text(r: Mapping[str, Cell], stage: str) -> str:
    """``floor.<stage>.fraction`` as a percentage (starred on untrusted floors); ``none: no
    model floor`` for a library without the model floors."""
    if r.get("model_floors") is False:
        return NO_MODEL_FLOOR
    text = _percent(r.get(f"floor_{stage}"))
    if text == "-" and stage in WARM_FLOOR_STAGES and r.get("predict_passes") == 1:
        return NO_WARM_PASS
    return f"{text}*" if text != "-" and r.get("floors_untrusted") else text


def cost_table(rows: Sequence[Mapping[str, Cell]]) -> str:
    """The predict phase's cost per prediction: end to end, per stage, MFU and the model floors
    (the libraries that ran; a refused one's row in the first table says why)."""
    header = [
        "library",
        "e2e ms/pred",
        *[f"{st} ms/pred" for st in PREDICT_STAGES],
        "MFU (predict)",
        *[f"{st} vs floor" for st in MODEL_FLOOR_STAGES],
    ]
    lines = [
        [
            str(r["variant"]),
            _num(r.get("e2e_ms_per_prediction"), ".4f"),
            *[_num(r.get(f"{st}_ms_per_prediction"), ".4f") for st in PREDICT_STAGES],
            _mfu_text(r),
            *[_floor_text(r, st) for st in MODEL_FLOOR_STAGES],
        ]
        for r in rows
        if r.get("validity") not in (REFUSED, DATA_ERROR)
    ]
    return markdown_table(header, lines)


COST_CAPTION = (
    "Cost per prediction, predict phase (ms = 1000 x seconds / e2e.predict.rows, each run's, the median over "
    "its VALID rounds; a stage's `-`: the library has no such step, or no VALID round):"
)
BUSY_HOST_NOTE = (
    "Note: --include-busy-host: figures include rounds INVALID only because other processes used the cores "
    "(host.other_cpu_fraction[_before] > run.max_host_load); they are this loaded host's figures, to read as "
    "indicative, not as claims."
)


def notes(rows: Sequence[Mapping[str, Cell]]) -> list[str]:
    """What the tables cannot say in a cell: quality rows that differ (not compared), the
    libraries whose figures leave out INVALID or FAILED rounds, a library's own overrides,
    predict passes that differ, and why a library has no MFU or no model floors."""
    out = []
    for r in rows:
        if own := cast(list[str], r.get("overrides") or []):
            out.append(
                f"Note: {r['variant']} ran with overrides of its own after --set (--library-set): {', '.join(own)}."
            )
    ran = [r for r in rows if r.get("validity") not in (REFUSED, DATA_ERROR)]
    if any(r.get("busy_rounds_counted") for r in ran):
        out.append(BUSY_HOST_NOTE)
    if any(r.get("quality_compared") is False for r in ran):
        scored = "; ".join(f"{r['variant']} {_rows_range(r)}" for r in ran)
        out.append(
            f"Note: quality is not compared: the libraries scored different held-out rows (quality.rows: {scored}), "
            "so their figures are over different row sets."
        )
    for r in ran:
        valid, total = r.get("valid_rounds"), r.get("rounds")
        if valid == total:
            continue
        why = []
        if reasons := "; ".join(cast(list[str], r.get("invalid_reasons") or [])):
            why.append(f"not VALID: {reasons}")
        if r.get("failed_rounds"):
            why.append(f"{r['failed_rounds']} FAILED")
        busy = r.get("busy_rounds_counted") or 0
        if busy:
            figures = f"its figures are medians over those and {busy} INVALID only for the host's load"
        else:
            figures = "its figures are medians over those only" if valid else "no figures"
        out.append(f"Note: {r['variant']}: {valid} of {total} rounds VALID, {figures} ({'; '.join(why)}).")
    passes = {str(r["variant"]): _num(r.get("predict_passes"), ".0f") for r in ran}
    if len({p for p in passes.values() if p != "-"}) > 1:
        each = ", ".join(f"{lib} {p}" for lib, p in passes.items())
        out.append(
            f"Note: the libraries' runs made different numbers of predict passes (e2e.predict.passes: {each}); "
            "each run's e2e figures are over all of its passes, the first (first call, cold caches) included."
        )
    for r in ran:
        if _mfu_text(r) == NO_FLOPS:
            out.append(f"Note: no MFU for {r['variant']}: {r['flops_note']}.")
    if none := [str(r["variant"]) for r in ran if r.get("model_floors") is False]:
        out.append(
            "Note: the tensorize and compute floors are the reference model's work (its tensors and GEMMs, "
            f"Library.model_floors); {', '.join(none)} {'has' if len(none) == 1 else 'have'} none."
        )
    for r in ran:
        if untrusted := cast(list[str], r.get("floors_untrusted") or []):
            out.append(f"Note: {r['variant']}'s floor fractions (*) stand on untrusted floors: {'; '.join(untrusted)}.")
    return out


def to_markdown(rows: Sequence[Mapping[str, Cell]], kind: str, relbench: bool = False) -> str:
    """The table, the cost per prediction (``cost_table``), then the notes (``notes``)."""
    h = headline(kind, relbench)
    header = [
        "library",
        f"{h.name} [95% CI] ({h.baseline_label})",
        K.QUALITY_ROWS,
        "nll raw -> calibrated",
        "e2e predict rows/s",
        "e2e vs reference [95% CI]",
        "steady rows/s",
        "first call s",
        "batch p99 ms",
        "peak RSS MiB (median)",
        "parameters",
        "VALID rounds",
        "validity",
    ]
    lines = []
    for r in rows:
        if r.get("validity") in (REFUSED, DATA_ERROR):
            label = "refused" if r["validity"] == REFUSED else "data error"
            lines.append([str(r["variant"]), f"{label}: {r['reason']}", *["-"] * 9, "0", str(r["validity"])])
            continue
        lines.append(
            [
                str(r["variant"]),
                _quality_text(r, relbench),
                _num(r.get("quality_rows"), ",.0f"),
                _nll_text(r),
                _num(r["e2e_predict_rows_per_s"], ",.0f"),
                _vs_ref_text(r),
                _num(r["steady_rows_per_s"], ",.0f"),
                _num(r["first_call_s"], ".2f"),
                _num(r["batch_p99_ms"], ".1f"),
                _num(r["peak_rss_mib"], ",.0f"),
                _num(r["parameters"], ",.0f"),
                f"{r['valid_rounds']}/{r['rounds']}",
                str(r["validity"]),
            ]
        )
    ran = any(r.get("validity") not in (REFUSED, DATA_ERROR) for r in rows)
    cost = [COST_CAPTION, cost_table(rows)] if ran else []  # no library ran: no cost to show
    return "\n\n".join([markdown_table(header, lines), *cost, *notes(rows)])


@dataclass
class Launch:
    """Where and how the libraries' processes run (the report's store and spec folder)."""

    spec_path: Path
    overrides: list[str]
    parent: str
    workdir: Path
    tracking_uri: str
    library_overrides: Mapping[str, Sequence[str]] = field(default_factory=dict)  # --library-set, after overrides

    def overrides_for(self, library: str) -> list[str]:
        """The overrides one library's child runs with: ``--set``'s, its own, its name."""
        return [*self.overrides, *self.library_overrides.get(library, []), f"model.library={library}"]


def refusals(
    spec_path: Path,
    overrides: list[str],
    libraries: Sequence[str],
    library_overrides: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, str]:
    """Each library's check on the spec with its overrides (no library is imported): the
    refused ones, with why."""
    from tasks.libraries import check_library
    from tasks.runtime.errors import UserError
    from tasks.spec import load_spec

    own = library_overrides or {}
    out = {}
    for lib in libraries:
        try:
            check_library(load_spec(spec_path, [*overrides, *own.get(lib, []), f"model.library={lib}"]))
        except UserError as err:
            out[lib] = " ".join(str(err).split())
    return out


def collect(
    launch: Launch,
    rounds: int,
    libraries: list[str],
    refused: dict[str, str],
    say: Callable[[str], None],
    data_errors: dict[str, str] | None = None,
) -> tuple[list[Sample], dict[str, float]]:
    """Every library in every round (order rotated); the samples and ``model.parameters`` by
    run id. A child that exits 2 adds its library to ``refused`` when it refused a setting,
    else to ``data_errors`` (either way, no further rounds: the same input fails the same way)."""
    data_errors = data_errors if data_errors is not None else {}
    from flows.sweeps.launch import launch_local
    from tasks.spec import load_spec
    from tasks.tracking.reader import get_stored_run

    samples: list[Sample] = []
    parameters: dict[str, float] = {}
    for r in range(rounds):
        for lib in round_order(libraries, r):
            if lib in refused or lib in data_errors:
                continue
            name = f"{lib}-{r}"
            spec = load_spec(launch.spec_path, launch.overrides_for(lib))
            done = launch_local(
                spec.to_dict(),
                name=name,
                spec_dir=str(launch.spec_path.parent),
                parent_run_id=launch.parent,
                tags={VARIANT_TAG: lib, ROUND_TAG: str(r)},
                workdir=launch.workdir,
                tracking_uri=launch.tracking_uri,
                api_url=None,  # each child starts Prefect's temporary server, as a standalone run does
            )
            if done.summary is None:
                if done.returncode == 2:  # a refusal, or input the user can fix
                    why = done.error or "exit 2"
                    into, label = (refused, REFUSED) if is_refusal(lib, why) else (data_errors, DATA_ERROR)
                    into[lib] = why
                    say(f"  round {r + 1} {lib:<24} {label}: {why[-400:]}")
                    continue
                say(f"  round {r + 1} {lib:<24} FAILED (exit {done.returncode}): {str(done.error)[-400:]}")
                samples.append(Sample(lib, r, None))
                continue
            rec = get_stored_run(done.summary.run_id, launch.tracking_uri)
            report = replace(done.summary, tags=rec.tags)
            try:
                parameters[report.run_id] = float(rec.params[PARAMETERS_PARAM])
            except (KeyError, ValueError):
                pass
            samples.append(Sample(lib, r, report))
            m = report.metrics
            say(
                f"  round {r + 1} {lib:<24} e2e {m.get(K.E2E_PREDICT_ROWS_PER_S, math.nan):>10,.0f} rows/s, "
                f"steady {m.get(K.STEADY_ROWS_PER_S, math.nan):>10,.0f} rows/s, "
                f"first call {m.get(K.FIRST_CALL_SECONDS, math.nan):.2f} s ({report.validity}, run {report.run_id[:8]})"
            )
    return samples, parameters


def run_report(
    spec_path: Path,
    overrides: list[str],
    rounds: int,
    libraries: list[str],
    say: Callable[[str], None],
    library_overrides: Mapping[str, Sequence[str]] | None = None,
    include_busy_host: bool = False,
) -> str:
    from tasks.runtime.errors import UserError
    from tasks.spec import load_spec
    from tasks.tracking.writer import Tracker

    if rounds < 1:
        raise UserError("--rounds must be at least 1.")
    s = load_spec(spec_path, overrides)
    own = {lib: list(o) for lib, o in (library_overrides or {}).items()}
    refused = refusals(spec_path, overrides, libraries, own)
    for lib, why in refused.items():
        say(f"  {lib}: refused by its check, not run: {why}")
    tracker = Tracker(s.name)
    parent = tracker.start(f"{s.name}-models-report", {"relflow.spec_hash": s.spec_hash, "relflow.report": "models"})
    say(f"parent MLflow run {parent} in experiment '{s.name}'")
    try:
        workdir = Path(s.run.output_dir).resolve() / f"models-{parent[:12]}"
        workdir.mkdir(parents=True, exist_ok=True)
        launch = Launch(spec_path, overrides, parent, workdir, tracker.uri, own)
        data_errors: dict[str, str] = {}
        samples, parameters = collect(launch, rounds, libraries, refused, say, data_errors)
        relbench = s.source.relbench is not None
        rows = summarize(samples, s.task.kind, refused, parameters, data_errors, relbench, own, include_busy_host)
        md = to_markdown(rows, s.task.kind, relbench)
        report = {
            "rows": rows,
            "libraries": libraries,
            "rounds": rounds,
            "overrides": overrides,
            "library_overrides": own,
            "include_busy_host": include_busy_host,
            "notes": notes(rows),
        }
        tracker.log_dict(report, "models_report.json")
        tracker.log_text(md, "models_report.md")
        tracker.finish()
    except BaseException as err:
        tracker.fail(err)
        raise
    return md
