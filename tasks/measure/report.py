"""One run's report as it crosses a process boundary, and the summaries built from many.

A sweep, ``compile-report`` and ``backends-report`` each start ``relflow-bench run`` in
fresh processes and read the child's result back: ``RunSummary`` is that result, typed. It
is the ``--json`` summary the child writes (``RunSummary.from_json``) or, for a child that
ran elsewhere (a work-pool worker) or earlier (a resumed sweep), its MLflow run
(``RunSummary.from_record``). ``to_json`` writes exactly the summary format, so
``from_json(r.to_json()) == r``.

The reports then put many runs side by side: ``summarize`` groups ``Sample`` s (one run of
one variant in one round) and fills one row per group from the report's columns;
``Group`` gives each column the medians and order-statistic 95% intervals
(``tasks.measure.stats``) over the group's rounds, ``ratio_interval`` the interval of a
paired per-round ratio (a speed-up), ``slower_by_paired_ratio`` the note for a variant whose
paired ratio's interval lies wholly below 1, and ``markdown_table`` / ``interval_text`` the one
table format every report prints.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Protocol

from tasks.measure import keys as K
from tasks.measure.stats import MIN_CI_SAMPLES, MedianInterval, median_interval

# A JSON value as the child wrote it (stage rows, profile tables): read back, never interpreted here.
Json = None | bool | int | float | str | list["Json"] | dict[str, "Json"]
Cell = float | str | int | bool | None | list[str]


class Record(Protocol):
    """What ``from_record`` reads of an MLflow run (``tasks.tracking.reader.StoredRun``);
    a protocol so this module does not import MLflow."""

    @property
    def run_id(self) -> str: ...
    @property
    def experiment(self) -> str: ...
    @property
    def metrics(self) -> dict[str, float]: ...
    @property
    def params(self) -> dict[str, str]: ...
    @property
    def tags(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class RunSummary:
    """One ``relflow-bench run``: the summary its ``--json`` writes, typed."""

    run_id: str
    metrics: dict[str, float]
    validity: str  # VALID | INVALID; FAILED for a run that never finished
    quality_metric: str | None = None  # the headline quality name (K.HEADLINE_QUALITY)
    experiment: str = ""
    experiment_id: str = ""
    tracking_uri: str = ""
    stages: list[dict[str, Json]] = field(default_factory=list)
    output_path: str | None = None
    checkpoint_path: str | None = None
    quality_meaningful: bool = True
    generated_data: bool = False
    encoder_path: str = ""
    invalid_reasons: list[str] = field(default_factory=list)
    profile: dict[str, Json] = field(default_factory=dict)
    # Read from MLflow only (the summary has no tags); never written by to_json.
    tags: dict[str, str] = field(default_factory=dict)
    # Keys a newer child wrote that this version does not know: kept, so to_json round-trips.
    extra: dict[str, Json] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Json]:
        out: dict[str, Json] = {}
        for f in fields(self):
            if f.name not in ("tags", "extra"):
                out[f.name] = getattr(self, f.name)
        return {**out, **self.extra}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    @classmethod
    def from_dict(cls, data: Mapping[str, Json]) -> RunSummary:
        known = {f.name for f in fields(cls)} - {"tags", "extra"}
        missing = [k for k in ("run_id", "metrics", "validity") if k not in data]
        if missing:
            raise ValueError(f"run summary lacks {', '.join(missing)}: not written by `relflow-bench run --json`")
        args = {k: v for k, v in data.items() if k in known}
        metrics = data["metrics"]
        if not isinstance(metrics, dict):
            raise ValueError("run summary 'metrics' is not an object")
        args["metrics"] = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
        extra = {k: v for k, v in data.items() if k not in known}
        return cls(**args, extra=extra)  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, text: str) -> RunSummary:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("run summary is not a JSON object")
        return cls.from_dict(data)

    @classmethod
    def from_record(cls, rec: Record) -> RunSummary:
        """The same report from the child's MLflow run (no stage table or profile there)."""
        kind = rec.params.get("task.kind")
        return cls(
            run_id=rec.run_id,
            metrics=dict(rec.metrics),
            validity=rec.tags.get("relflow.validity", ""),
            quality_metric=K.HEADLINE_QUALITY.get(kind) if kind else None,
            experiment=rec.experiment,
            output_path=rec.tags.get("relflow.output_path"),
            quality_meaningful=rec.tags.get("relflow.quality_meaningful", "true") == "true",
            encoder_path=rec.tags.get("relflow.encoder_path", ""),
            invalid_reasons=[r for r in rec.tags.get("relflow.invalid_reasons", "").split("; ") if r],
            tags=dict(rec.tags),
        )

    def metric(self, key: str) -> float:
        """The metric, NaN when this run did not log it."""
        return self.metrics.get(key, math.nan)

    @property
    def quality(self) -> float | None:
        """The headline quality figure, when the run logged it."""
        return self.metrics.get(K.quality(self.quality_metric)) if self.quality_metric else None


@dataclass(frozen=True)
class Sample:
    """One child process of a report: a variant in one round (``report`` None: it failed)."""

    variant: str
    round: int
    report: RunSummary | None
    cache: str = "none"  # compile-report: "none" (eager), "cold" or "warm" Inductor cache

    @property
    def validity(self) -> str:
        return self.report.validity if self.report is not None else "FAILED"

    @property
    def metrics(self) -> dict[str, float]:
        return self.report.metrics if self.report is not None else {}

    @property
    def run_id(self) -> str:
        return self.report.run_id if self.report is not None else ""


@dataclass(frozen=True)
class Group:
    """The samples of one table row (one variant, or one variant and cache state)."""

    key: tuple[str, ...]
    samples: tuple[Sample, ...]

    @property
    def reports(self) -> list[RunSummary]:
        """The runs that finished (failed rounds have no figures)."""
        return [s.report for s in self.samples if s.report is not None]

    def values(self, key: str) -> list[float]:
        """The metric from every finished round that logged it, in round order."""
        return [r.metrics[key] for r in self.reports if key in r.metrics]

    def median(self, key: str) -> float:
        vals = self.values(key)
        return median_interval(vals).median if vals else math.nan

    def interval(self, key: str) -> MedianInterval | None:
        """Median and (from MIN_CI_SAMPLES rounds) its 95% interval; None without values."""
        vals = self.values(key)
        return median_interval(vals) if vals else None

    def max(self, key: str) -> float:
        return max(self.values(key), default=math.nan)

    def by_round(self, key: str) -> dict[int, float]:
        return {
            s.round: s.report.metrics[key] for s in self.samples if s.report is not None and key in s.report.metrics
        }


def groups(samples: Iterable[Sample], by: Callable[[Sample], tuple[str, ...]]) -> list[Group]:
    """Samples grouped by ``by``, groups in order of first appearance."""
    out: dict[tuple[str, ...], list[Sample]] = {}
    for s in samples:
        out.setdefault(by(s), []).append(s)
    return [Group(k, tuple(v)) for k, v in out.items()]


def summarize(
    samples: Iterable[Sample],
    columns: Mapping[str, Callable[[Group], Cell]],
    by: Callable[[Sample], tuple[str, ...]] = lambda s: (s.variant,),
    names: Sequence[str] = ("variant",),
) -> list[dict[str, Cell]]:
    """One row per group: the group's key under ``names``, then each column's value."""
    rows: list[dict[str, Cell]] = []
    for g in groups(samples, by):
        row: dict[str, Cell] = dict(zip(names, g.key, strict=True))
        row.update({name: col(g) for name, col in columns.items()})
        rows.append(row)
    return rows


def ratio_interval(numerator: Mapping[int, float], denominator: Mapping[int, float]) -> MedianInterval | None:
    """Median of the per-round ratios ``numerator[r] / denominator[r]`` over the rounds both
    ran, with its order-statistic 95% interval from MIN_CI_SAMPLES rounds.

    Rounds are interleaved, so a round's two runs share the machine's state at that time:
    the paired ratio cancels drift that a ratio of two separate medians would carry, and
    its interval is distribution-free (rounds independent). None when no round pairs."""
    ratios = [numerator[r] / denominator[r] for r in sorted(numerator) if r in denominator and denominator[r] > 0]
    return median_interval(ratios) if ratios else None


def interval_text(low: float | None, high: float | None, n: int, fmt: str = ",.0f") -> str:
    """The 95% interval as ``low, high``, or why there is none (too few rounds)."""
    if low is None or high is None:
        return f"n={n}<{MIN_CI_SAMPLES}, no CI"
    return f"{low:{fmt}}, {high:{fmt}}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub-flavoured markdown table, one line per row."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def slower_by_paired_ratio(
    rows: Sequence[Mapping[str, Cell]],
    *,
    label: Callable[[Mapping[str, Cell]], str],
    is_candidate: Callable[[Mapping[str, Cell]], bool],
    baseline: str,
    figure: str,
    low: str,
    high: str,
) -> list[str]:
    """A note for each candidate row whose paired per-round ratio to the baseline
    (``ratio_interval``: each round's candidate figure over that round's baseline figure) has
    a 95% interval wholly below 1: slower in the same rounds, whatever the host's drift
    between rounds. Unpaired intervals of the two medians carry that drift, so they can
    overlap while every round shows the candidate slower. Rows without an interval (too few
    rounds) are not judged."""
    notes = []
    for r in rows:
        r_low, r_high = r.get(low), r.get(high)
        if not is_candidate(r) or not isinstance(r_low, int | float) or not isinstance(r_high, int | float):
            continue
        if r_high < 1.0:
            notes.append(
                f"{label(r)} is slower than {baseline}: its {figure} over {baseline}'s in the same round has "
                f"the 95% interval [{r_low:.2f}x, {r_high:.2f}x], wholly below 1"
            )
    return notes
