"""``relflow-bench budget SPEC``: quality against cost across context sizes, one fresh process each.

A budget is a sweep (``flows/sweeps/grid.py``: the same grid, expansion, validation, fresh
``relflow-bench run`` children, parent/child MLflow runs, resumption) whose keys are context
sizes: a branch's ``max_length`` or ``overflow`` (``orders.max_length=4,8,16``), or any key
under ``model.rt.context`` (relational-transformers' context budget, e.g.
``model.rt.context.max_context_cells=128,256,512``, read by ``model.rt.context.builder:
rt_utils``). With no grid, the default is relational-transformers' ``max_context_cells`` at
128..2048 when the spec builds its contexts with ``rt_utils``, else each top-level branch's
``max_length`` at a quarter, half and all of its value.

For each point it reads the child's figures back from MLflow and records (``tasks/measure/keys.py``
``budget.*``, logged on the child run; the parent logs the table):

- test quality with its 95% interval: ``relbench.<metric>`` and ``relbench.<metric>.ci_low|ci_high``
  for a RelBench task relbench scores, else the harness's ``quality.<headline>`` and its interval
  (``models_report.headline``);
- end-to-end milliseconds per prediction (``e2e.predict.seconds`` over ``e2e.predict.rows``) and
  per stage (``stage.<stage>.predict.seconds`` over the same rows);
- present and padded cells per prediction (``data.coords_present`` and ``data.padded_coords``,
  each over the rows of the passes it counts);
- peak memory (``memory.host_peak_bytes``).

Then the Pareto front (quality up, cost down: ``tasks/measure/pareto.py`` has the exact rule;
points whose quality intervals overlap are not ranked against each other), a Markdown table,
a Plotly chart (``dashboards/budget.py``: HTML and PNG) and the parent run's artifacts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flows.sweeps.models_report import Headline, headline
from tasks.libraries import library_for
from tasks.measure import keys as K
from tasks.measure.pareto import Point, Ranked, front
from tasks.measure.report import markdown_table
from tasks.runtime.errors import UserError
from tasks.spec import Spec

# relational-transformers' context budget keys (model.rt.context.*) and the default grid of its
# cell budget; every other library's context is its branches' max_length and overflow.
RT_CONTEXT_PREFIX = "model.rt.context."
RT_MAX_CELLS = "model.rt.context.max_context_cells"
BRANCH_CONTEXT_FIELDS = ("max_length", "overflow")
# the predict stages, with the encode step (text columns; relational-transformers' strings) in its place
STAGE_COLUMNS = ("retrieve", "preprocess", "encode", "tensorize", "compute", "calibrate", "write")
REPORT_TAG = "relflow.report"
REPORT = "budget"
FRONT_TAG = "relflow.budget.front"  # on each child: front | dominated | not ranked


def is_context_key(key: str) -> bool:
    """Whether a grid key sets a context size: ``<branch>.max_length|overflow`` (by name or
    path) or a ``model.rt.context.*`` key."""
    if key.startswith(RT_CONTEXT_PREFIX):
        return True
    head, _, last = key.rpartition(".")
    return bool(head) and last in BRANCH_CONTEXT_FIELDS and not head.startswith(("run", "model", "task", "source"))


def check_context_keys(grid: Mapping[str, list[Any]]) -> None:
    """Refuse (exit 2) a grid key that is not a context size, naming the ones that are."""
    wrong = [k for k in grid if not is_context_key(k)]
    if wrong:
        raise UserError(
            f"budget grid key(s) {', '.join(wrong)} are not context sizes; a budget varies "
            "<branch>.max_length, <branch>.overflow (e.g. --grid orders.max_length=4,8,16) or "
            f"{RT_CONTEXT_PREFIX}* (e.g. --grid {RT_MAX_CELLS}=128,512,2048). "
            "For other keys use `relflow-bench sweep`."
        )
    if not grid or all(len(v) < 2 for v in grid.values()):
        raise UserError("a budget needs at least two context sizes: give a --grid key two or more values.")


def default_grid(spec: Spec) -> dict[str, list[Any]]:
    """The grid when none is given: the library's own context budget when it has one
    (``Library.budget_grid``: RT's cell budget under the rt_utils builder), else each top-level
    branch's ``max_length`` at a quarter, a half and all of its value."""
    own = library_for(spec).budget_grid(spec)
    if own is not None:
        return dict(own)
    grid: dict[str, list[Any]] = {}
    for b in spec.schema_.branches:
        n = b.max_length
        values = sorted({max(1, n // 4), max(1, n // 2), n})
        if len(values) > 1:
            grid[f"{b.name}.max_length"] = values
    if not grid:
        raise UserError("no default budget grid for this spec (no branch longer than 1): give --grid.")
    return grid


@dataclass
class BudgetPoint:
    """One context size's figures (a failed or unfinished point has ``run_id`` and nothing else)."""

    index: int
    label: str
    values: dict[str, str]
    status: str  # FINISHED | FAILED | SKIPPED (finished in an earlier attempt of this budget)
    run_id: str | None
    validity: str | None = None
    quality: float | None = None
    quality_low: float | None = None
    quality_high: float | None = None
    ms_per_prediction: float | None = None
    stage_ms_per_prediction: dict[str, float] = field(default_factory=dict)
    cells_present_per_prediction: float | None = None
    cells_padded_per_prediction: float | None = None
    peak_rss_mib: float | None = None
    rows: float | None = None
    invalid_reasons: list[str] = field(default_factory=list)
    error: str | None = None
    # filled by rank()
    on_front: bool = False
    ranked: bool = False
    dominated_by: list[int] = field(default_factory=list)

    def pareto_point(self) -> Point:
        return Point(self.label, self.quality, self.ms_per_prediction, self.quality_low, self.quality_high)


def _get(m: Mapping[str, float], key: str) -> float | None:
    v = m.get(key)
    return None if v is None or math.isnan(v) else float(v)


def per_prediction(m: Mapping[str, float], key: str, rows_key: str, scale: float = 1.0) -> float | None:
    total, rows = _get(m, key), _get(m, rows_key)
    return None if total is None or not rows else scale * total / rows


def figures(point: BudgetPoint, metrics: Mapping[str, float], h: Headline) -> BudgetPoint:
    """The point's figures from its child run's metrics (in place; returned for chaining)."""
    point.quality, point.quality_low, point.quality_high = (
        _get(metrics, h.key),
        _get(metrics, h.low),
        _get(metrics, h.high),
    )
    point.rows = _get(metrics, K.E2E_PREDICT_ROWS)
    point.ms_per_prediction = per_prediction(metrics, K.E2E_PREDICT_SECONDS, K.E2E_PREDICT_ROWS, 1000.0)
    point.stage_ms_per_prediction = {
        s: v
        for s in STAGE_COLUMNS
        if (v := per_prediction(metrics, K.stage_seconds(s, "predict"), K.E2E_PREDICT_ROWS, 1000.0)) is not None
    }
    # both counts cover the predict passes' root rows (data.rows_predicted, e2e.predict.rows)
    point.cells_present_per_prediction = per_prediction(metrics, K.DATA_COORDS_PRESENT, K.DATA_ROWS_PREDICTED)
    point.cells_padded_per_prediction = per_prediction(metrics, K.DATA_PADDED_COORDS, K.DATA_ROWS_PREDICTED)
    peak = _get(metrics, K.HOST_PEAK_BYTES)
    point.peak_rss_mib = None if peak is None else peak / 2**20
    return point


def rank(points: Sequence[BudgetPoint], higher_is_better: bool) -> list[Ranked]:
    """Mark each point's place on the Pareto front (in place)."""
    ranks = front([p.pareto_point() for p in points], higher_is_better)
    for p, r in zip(points, ranks, strict=True):
        p.on_front, p.ranked = r.on_front, r.ranked
        p.dominated_by = [points[i].index for i in r.dominated_by]
    return ranks


def child_metrics(p: BudgetPoint) -> dict[str, float]:
    """The ``budget.*`` figures logged on the point's child run."""
    out: dict[str, float] = {}
    if p.ms_per_prediction is not None:
        out[K.BUDGET_MS_PER_PREDICTION] = p.ms_per_prediction
    for s, v in p.stage_ms_per_prediction.items():
        out[K.budget_stage_ms(s)] = v
    if p.cells_present_per_prediction is not None:
        out[K.BUDGET_CELLS_PRESENT_PER_PREDICTION] = p.cells_present_per_prediction
    if p.cells_padded_per_prediction is not None:
        out[K.BUDGET_CELLS_PADDED_PER_PREDICTION] = p.cells_padded_per_prediction
    if p.ranked:
        out[K.BUDGET_ON_FRONT] = float(p.on_front)
        out[K.BUDGET_DOMINATED_BY] = float(len(p.dominated_by))
    return out


def front_text(p: BudgetPoint) -> str:
    if not p.ranked:
        return "not ranked"
    if p.on_front:
        return "front"
    return "dominated by " + ", ".join(f"#{i + 1}" for i in p.dominated_by)


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None or math.isnan(v) else format(v, fmt)


def quality_text(p: BudgetPoint) -> str:
    if p.quality is None:
        return "-"
    ci = (
        f" [{p.quality_low:.4f}, {p.quality_high:.4f}]"
        if p.quality_low is not None and p.quality_high is not None
        else ""
    )
    return f"{p.quality:.4f}{ci}"


def table_rows(points: Sequence[BudgetPoint]) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the budget table (Markdown and Rich print the same cells)."""
    header = [
        "#",
        "point",
        "quality [95% CI]",
        "Pareto",
        "e2e ms/pred",
        *[f"{s} ms" for s in STAGE_COLUMNS],
        "present cells/pred",
        "padded cells/pred",
        "peak RSS MiB",
        "validity",
        "run",
    ]
    rows = []
    for p in points:
        if p.status == "FAILED":
            rows.append([str(p.index + 1), p.label, f"FAILED: {p.error or '-'}"[:120], "not ranked"] + ["-"] * 12)
            continue
        rows.append(
            [
                str(p.index + 1),
                p.label,
                quality_text(p),
                front_text(p),
                _num(p.ms_per_prediction, ".3f"),
                *[_num(p.stage_ms_per_prediction.get(s), ".3f") for s in STAGE_COLUMNS],
                _num(p.cells_present_per_prediction, ",.1f"),
                _num(p.cells_padded_per_prediction, ",.1f"),
                _num(p.peak_rss_mib, ",.0f"),
                p.validity or "-",
                (p.run_id or "-")[:8],
            ]
        )
    return header, rows


def notes(points: Sequence[BudgetPoint], h: Headline) -> list[str]:
    direction = "higher" if h.higher_is_better else "lower"
    out = [
        f"Quality: {h.name} ({direction} is better) with its 95% interval; cost: end-to-end predict ms per "
        "prediction. Pareto: a point is dominated when another's quality interval lies wholly on the better "
        "side of its own and that point costs no more; overlapping intervals are not ranked against each other."
    ]
    bad = [p for p in points if p.ranked and p.validity not in (None, "VALID")]
    if bad:
        why = "; ".join(f"#{p.index + 1}: {', '.join(p.invalid_reasons) or p.validity}" for p in bad)
        out.append(f"Note: ranked INVALID points (their cost is the harness's untrusted figure): {why}.")
    return out


def to_markdown(points: Sequence[BudgetPoint], h: Headline) -> str:
    header, rows = table_rows(points)
    return "\n\n".join([markdown_table(header, rows), *notes(points, h)])


@dataclass
class BudgetResult:
    """What the command prints and the parent run keeps."""

    parent_run_id: str
    experiment: str
    tracking_uri: str
    quality_key: str
    higher_is_better: bool
    points: list[BudgetPoint]
    markdown: str
    files: list[str]
    png_skipped: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def points_from_sweep(
    summary: Mapping[str, Any], h: Headline, read: Callable[[str], tuple[dict[str, float], dict[str, str]]]
) -> list[BudgetPoint]:
    """Each sweep row as a budget point, its figures read back from its child run."""
    points = []
    for r in summary["rows"]:
        p = BudgetPoint(r["index"], r["config"], dict(r["values"]), r["status"], r["run_id"], error=r.get("error"))
        if r["status"] != "FAILED" and r["run_id"]:
            metrics, tags = read(r["run_id"])
            figures(p, metrics, h)
            p.validity = tags.get("relflow.validity") or r.get("validity")
            reasons = tags.get("relflow.invalid_reasons")
            p.invalid_reasons = [x for x in (reasons or "").split("; ") if x]
        points.append(p)
    return points


def run_budget(
    base_spec: dict[str, Any],
    grid: dict[str, list[Any]],
    spec_dir: str,
    tags: Mapping[str, str],
    out_dir: Path | None,
    png: bool,
    say: Callable[[str], None] = lambda s: None,
) -> BudgetResult:
    """Run the budget's grid as a sweep (fresh processes, one parent run), then rank, tabulate,
    chart and record it on the parent run. The grid is checked by the caller (``expand``)."""
    from dashboards.budget import budget_figure, write_chart
    from flows.sweeps.grid import sweep
    from tasks.spec import parse_spec
    from tasks.tracking.reader import get_stored_run
    from tasks.tracking.writer import Tracker

    base = parse_spec(base_spec, "(budget base spec)")
    h = headline(base.task.kind, base.source.relbench is not None)
    summary = sweep(base_spec=base_spec, grid=grid, spec_dir=spec_dir, tags={**tags, REPORT_TAG: REPORT})
    parent = summary["parent_run_id"]
    tracker = Tracker(base.name)
    uri = tracker.uri

    def read(run_id: str) -> tuple[dict[str, float], dict[str, str]]:
        rec = get_stored_run(run_id, uri)
        return rec.metrics, rec.tags

    points = points_from_sweep(summary, h, read)
    rank(points, h.higher_is_better)
    md = to_markdown(points, h)
    out = (out_dir or Path(base.run.output_dir) / f"budget-{parent[:12]}").resolve()
    fig = budget_figure(points, h.name, h.higher_is_better, title=f"{base.name}: quality against cost per context size")
    written = write_chart(fig, out, "budget", png=png)
    files = [*written.files, out / "budget.md", out / "budget.json"]
    result = BudgetResult(
        parent, base.name, uri, h.key, h.higher_is_better, points, md, [str(f) for f in files], written.png_skipped
    )
    files[-2].write_text(md + "\n")
    files[-1].write_text(json.dumps(result.to_dict(), indent=2, default=str))
    for p in points:  # the budget figures on each point's own run
        if p.run_id and p.status != "FAILED":
            child = Tracker(base.name, uri)
            child.run_id = p.run_id
            child.log_metrics(child_metrics(p))
            child.set_tags({FRONT_TAG: front_text(p).split(" ", 1)[0] if p.ranked else "not ranked"})
    tracker.reopen(parent)
    try:
        tracker.set_tags(
            {
                REPORT_TAG: REPORT,
                "mlflow.runName": f"{base.name}-budget",
                "relflow.budget.quality": h.key,
                "relflow.budget.cost": K.BUDGET_MS_PER_PREDICTION,
            }
        )
        tracker.log_metrics(
            {
                K.BUDGET_POINTS: float(len(points)),
                K.BUDGET_FRONT_POINTS: float(sum(p.on_front for p in points)),
            }
        )
        tracker.set_description(md)
        for f in files:
            tracker.log_artifact(f, "budget")
        tracker.finish()
    except BaseException as err:
        tracker.fail(err)
        raise
    say(f"budget files in {out}")
    return result
