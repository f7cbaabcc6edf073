"""The ``sweep`` flow: a grid of spec overrides, one fresh ``relflow-bench run`` process per configuration.

    relflow-bench sweep SPEC --grid run.batch_size=64,256,1024 --grid run.packing=auto,off

The Cartesian product of the grid runs one configuration at a time (the host lock inside
``benchmark`` keeps timed regions from overlapping with anything else on the host). Every
configuration is validated before the first one starts, so a bad value fails in a second.
Each configuration runs in its own fresh process, a standalone ``relflow-bench run`` of its
spec launched by the sweep's ``configuration`` task (``flows/sweeps/launch.py``), so no
compile cache, recompile budget, allocator state or peak RSS leaks from one to the next.

MLflow: one parent run (tag ``relflow.sweep_hash``: the base spec's hash + the grid) holds
one child run per configuration, tagged ``relflow.sweep.<key>=<value>`` for each swept key.
Resumable: rerunning the same sweep reuses the parent and skips every configuration that
already has a FINISHED child with the same ``relflow.spec_hash``. A failing configuration
ends its child FAILED (the child run does that; a failure before its MLflow run starts
gets a FAILED child here) and the sweep goes on; the summary lists it.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import tempfile
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.sweeps.launch import Launched, launch_local, prefect_api_url
from tasks.measure import keys as K
from tasks.measure.report import RunSummary
from tasks.runtime import progress
from tasks.runtime.errors import UserError
from tasks.runtime.masking import mask_uri
from tasks.spec import Spec, apply_overrides, branch_path, parse_spec
from tasks.tracking.reader import StoredRun, search_runs
from tasks.tracking.writer import Tracker, flatten


@dataclass(frozen=True)
class Config:
    """One point of the grid: the swept values (as validated) and the full spec."""

    index: int
    values: dict[str, str]  # swept key as the user wrote it -> validated value as text
    spec: dict[str, Any]
    spec_hash: str

    @property
    def label(self) -> str:
        short = [k.rsplit(".", 1)[-1] for k in self.values]
        names = short if len(set(short)) == len(short) else list(self.values)
        return " ".join(f"{n}={v}" for n, v in zip(names, self.values.values(), strict=True))


@dataclass
class Row:
    """One configuration's outcome, as the summary table shows it."""

    index: int
    config: str
    values: dict[str, str]
    status: str  # FINISHED | FAILED | SKIPPED (a FINISHED child already existed)
    run_id: str | None
    steady_rows_per_s: float | None = None
    e2e_rows_per_s: float | None = None
    quality_metric: str | None = None
    quality: float | None = None
    validity: str | None = None
    error: str | None = None
    stages: list[dict[str, Any]] = field(default_factory=list)


def expand(base: Spec, grid: dict[str, list[Any]]) -> list[Config]:
    """Every grid point as a validated spec; raises ``UserError`` naming the key or value."""
    if not grid:
        raise UserError("The sweep grid is empty; add at least one --grid key=v1,v2 (or sweep.grid).")
    base_raw = base.to_dict()
    resolved: dict[str, str] = {}
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise UserError(f"Sweep grid key '{key}' needs a non-empty list of values.")
        if key.split(".", 1)[0] == "name":
            raise UserError("Sweep grid key 'name' is not allowed: a sweep stays in one experiment.")
        try:
            resolved[key] = branch_path(base_raw, key)
        except UserError as err:
            raise UserError(f"Sweep grid key '{key}': {err}") from None
    configs = []
    for i, combo in enumerate(itertools.product(*grid.values())):
        raw = copy.deepcopy(base_raw)
        try:
            # JSON is YAML: typed values survive apply_overrides' YAML parsing unchanged.
            apply_overrides(raw, [f"{k}={json.dumps(v)}" for k, v in zip(grid, combo, strict=True)])
        except UserError as err:
            raise UserError(f"Sweep grid: {err}") from None
        shown = ", ".join(f"{k}={v}" for k, v in zip(grid, combo, strict=True))
        spec = parse_spec(raw, f"(sweep configuration {shown})")
        params = flatten(spec.to_dict())
        values = {k: params.get(resolved[k], str(v)) for k, v in zip(grid, combo, strict=True)}
        configs.append(Config(i, values, spec.to_dict(), spec.spec_hash))
    seen: dict[str, Config] = {}
    for c in configs:
        if c.spec_hash in seen:
            raise UserError(
                f"Sweep grid repeats a configuration: '{seen[c.spec_hash].label}' and "
                f"'{c.label}' are the same spec; remove the duplicate value."
            )
        seen[c.spec_hash] = c
    return configs


def sweep_hash(base: Spec, configs: list[Config]) -> str:
    """Identity of a sweep: the base spec plus the grid (value order does not matter)."""
    grid: dict[str, set[str]] = {}
    for c in configs:
        for k, v in c.values.items():
            grid.setdefault(k, set()).add(v)
    blob = json.dumps(
        {"base": base.spec_hash, "grid": {k: sorted(v) for k, v in grid.items()}}, sort_keys=True
    ).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def config_row(c: Config, report: RunSummary, status: str, quality_metric: str) -> Row:
    """The summary row of one configuration's run (read back from its process or MLflow)."""
    return Row(
        c.index,
        c.label,
        c.values,
        status,
        report.run_id,
        steady_rows_per_s=report.metrics.get(K.STEADY_ROWS_PER_S),
        e2e_rows_per_s=report.metrics.get(K.E2E_PREDICT_ROWS_PER_S),
        quality_metric=quality_metric,
        quality=report.metrics.get(K.quality(quality_metric)),
        validity=report.validity or None,
        error=report.tags.get("relflow.error"),
        stages=list(report.stages),
    )


def row_from_record(c: Config, rec: StoredRun, status: str, kind: str) -> Row:
    """The row of a configuration whose run is read from MLflow (skipped, or run by a worker)."""
    return config_row(c, RunSummary.from_record(rec), status, K.HEADLINE_QUALITY[kind])


@task(
    name="configuration", task_run_name="configuration-{index}", cache_policy=NO_CACHE, persist_result=False, retries=0
)
def run_configuration(
    index: int,
    spec: dict[str, Any],
    spec_dir: str,
    parent_run_id: str,
    tags: dict[str, str],
    workdir: str,
    tracking_uri: str,
    api_url: str | None,
) -> Launched:
    """One configuration as a standalone ``relflow-bench run`` in a fresh process."""
    return launch_local(
        spec,
        name=f"config-{index}",
        spec_dir=spec_dir,
        parent_run_id=parent_run_id,
        tags=tags,
        workdir=Path(workdir),
        tracking_uri=tracking_uri,
        api_url=api_url,
    )


def _find_parent(experiment: str, shash: str) -> str | None:
    runs = search_runs(
        experiment,
        status=None,
        filter_string=f"tags.\"relflow.sweep_hash\" = '{shash}' and tags.\"relflow.sweep.role\" = 'parent'",
    )
    return runs[-1].run_id if runs else None  # the newest, should there be several


@flow(name="sweep", persist_result=False, validate_parameters=True)
def sweep(
    base_spec: dict[str, Any], grid: dict[str, list[Any]], spec_dir: str = ".", tags: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run every grid configuration of ``base_spec`` as a child MLflow run of one parent,
    each in its own process."""
    base = parse_spec(base_spec, "(sweep parameter 'base_spec')")
    configs = expand(base, grid)
    shash = sweep_hash(base, configs)
    attempt = uuid.uuid4().hex[:12]
    tracker, parent, reused = open_parent(base, base_spec, grid, len(configs), shash, tags)
    rows: list[Row] = []
    workdir = tempfile.TemporaryDirectory(prefix="relflow-sweep-")
    try:
        api_url = prefect_api_url()
        progress.emit("sweep", kind="parent", run_id=parent, reused=reused, sweep_hash=shash, total=len(configs))
        done = finished_children(base.name, parent)
        for c in configs:
            if c.spec_hash in done:
                r = row_from_record(c, done[c.spec_hash], "SKIPPED", base.task.kind)
                rows.append(r)
                progress.emit("sweep", kind="skipped", row=r, total=len(configs))
                continue
            progress.emit("sweep", kind="start", index=c.index, config=c.label, total=len(configs))
            child_tags = child_run_tags(shash, attempt, c, tags)
            launched = run_configuration(
                c.index, c.spec, spec_dir, parent, child_tags, workdir.name, tracker.uri, api_url
            )
            report = launched.summary
            if report is not None:
                q = report.quality_metric or K.HEADLINE_QUALITY[base.task.kind]
                r = config_row(c, report, "FINISHED", q)
            else:  # one configuration failing must not stop the sweep
                r = _record_failure(tracker, c, launched, child_tags, parent, base.task.kind)
            tracker.log_text(launched.log, f"configurations/{attempt}/config-{c.index}.log")
            rows.append(r)
            progress.emit("sweep", kind="done", row=r, total=len(configs))
        close_parent(tracker, rows, attempt)
    except BaseException as err:
        tracker.fail(err)
        raise
    finally:
        workdir.cleanup()
    return {
        "parent_run_id": parent,
        "experiment": base.name,
        "sweep_hash": shash,
        "reused_parent": reused,
        "tracking_uri": mask_uri(tracker.uri),
        "rows": [asdict(r) for r in rows],
    }


def open_parent(
    base: Spec, base_spec: dict[str, Any], grid: dict[str, list[Any]], n: int, shash: str, tags: dict[str, str] | None
) -> tuple[Tracker, str, bool]:
    """The sweep's parent MLflow run: reopened when an earlier sweep of the same grid left one
    (its FINISHED children are then skipped), else started with the grid as params."""
    tracker = Tracker(base.name)
    parent = _find_parent(base.name, shash)
    if parent is not None:
        tracker.reopen(parent)
        return tracker, parent, True
    parent = tracker.start(
        f"{base.name}-sweep",
        {
            "relflow.sweep_hash": shash,
            "relflow.sweep.role": "parent",
            "relflow.spec_hash": base.spec_hash,
            "relflow.spec_name": base.name,
            **(tags or {}),
        },
    )
    tracker.log_params(
        {
            "sweep.keys": ",".join(grid),
            "sweep.configurations": n,
            **{f"sweep.grid.{k}": json.dumps(v) for k, v in grid.items()},
        }
    )
    tracker.log_text(json.dumps({"base": base_spec, "grid": grid}, indent=2), "sweep.json")
    return tracker, parent, False


def finished_children(experiment: str, parent: str) -> dict[str | None, Any]:
    """The parent's FINISHED child runs by spec hash: configurations a rerun skips."""
    return {
        r.tags.get("relflow.spec_hash"): r
        for r in search_runs(experiment, status="FINISHED", filter_string=f"tags.\"mlflow.parentRunId\" = '{parent}'")
    }


def child_run_tags(
    shash: str, attempt: str, c: Config, tags: dict[str, str] | None, extra: dict[str, str] | None = None
) -> dict[str, str]:
    return {
        "relflow.sweep_hash": shash,
        "relflow.sweep.role": "child",
        "relflow.sweep.attempt": attempt,
        "relflow.sweep.index": str(c.index),
        **(extra or {}),
        **{f"relflow.sweep.{k}": v for k, v in c.values.items()},
        **(tags or {}),
    }


def close_parent(tracker: Tracker, rows: list[Row], attempt: str, workers: dict[int, str] | None = None) -> None:
    """Counts as tags and this attempt's summary as an artifact, then the parent ends FINISHED."""
    tracker.set_tags(
        {
            "relflow.sweep.failed": str(sum(r.status == "FAILED" for r in rows)),
            "relflow.sweep.skipped": str(sum(r.status == "SKIPPED" for r in rows)),
            "relflow.sweep.ran": str(sum(r.status == "FINISHED" for r in rows)),
        }
    )
    summary = [asdict(r) | {"stages": None} | ({"worker": workers.get(r.index)} if workers else {}) for r in rows]
    tracker.log_dict(summary, f"sweep_summary_{attempt}.json")
    tracker.finish()


def _record_failure(
    tracker: Tracker, c: Config, launched: Launched, child_tags: dict[str, str], parent: str, kind: str
) -> Row:
    """The failed configuration's child run (FAILED), created here if it never began one."""
    attempt, index = child_tags["relflow.sweep.attempt"], child_tags["relflow.sweep.index"]
    found = search_runs(
        tracker.experiment,
        status=None,
        filter_string=(f"tags.\"relflow.sweep.attempt\" = '{attempt}' and tags.\"relflow.sweep.index\" = '{index}'"),
    )
    if found:
        run_id = found[-1].run_id
    else:  # failed before its MLflow run started (bad input: exit 2)
        child = Tracker(tracker.experiment, tracker.uri)
        run_id = child.start(
            f"{tracker.experiment}-sweep-{index}",
            {"relflow.spec_hash": c.spec_hash, **child_tags},
            parent_run_id=parent,
        )
        text = launched.error or f"exit code {launched.returncode}"
        body = text.removeprefix("UserError: ")
        child.fail(UserError(body) if body != text else RuntimeError(text))
    return Row(
        c.index, c.label, c.values, "FAILED", run_id, quality_metric=K.HEADLINE_QUALITY[kind], error=launched.error
    )
