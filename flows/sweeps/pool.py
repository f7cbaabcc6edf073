"""A sweep fanned out to benchmark hosts: one ``benchmark`` flow run per configuration on a pool.

    relflow-bench sweep SPEC --grid run.batch_size=64,256 --pool relflow-cpu [--queue host-a]

Prefect does the distribution (no home-made scheduler): the sweep deploys the ``benchmark``
flow once as ``benchmark/<name>-sweep@<pool>`` (on demand, no schedule), then creates one
flow run of it per configuration with ``run_deployment(..., timeout=0)``; parameters are the
configuration's validated spec, its folder, the parent MLflow run id and the child tags (JSON,
far under Prefect's 512 KB limit). Whichever host's worker polls first runs it; a worker
started with ``--limit 1`` runs one benchmark at a time. ``--queue`` pins the sweep to one
work queue (a queue per host when configurations must land on particular hosts).

The parent waits for every flow run. MLflow records are those of the local sweep (one
parent run, one child per configuration with the ``relflow.sweep.*`` tags, resumable: a
rerun skips configurations that already have a FINISHED child). Each child is tagged with the
worker that ran it (``relflow.worker``, from the flow-run environment) and the host
(``relflow.host``). A flow run that ends FAILED / CRASHED / CANCELLED is a FAILED row, and its
MLflow child is ended FAILED if it was left RUNNING. A flow run whose worker stopped sending
heartbeats (killed, host lost: the flow-run process died with it) is set CRASHED in Prefect
and its MLflow child FAILED, so nothing is left RUNNING.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
from prefect.states import Crashed

from flows.sweeps.grid import (
    Config,
    Row,
    child_run_tags,
    close_parent,
    expand,
    finished_children,
    open_parent,
    row_from_record,
    sweep_hash,
)
from tasks.measure import keys as K
from tasks.measure.clock import wall_clock
from tasks.runtime import progress
from tasks.runtime.errors import UserError
from tasks.runtime.masking import mask_uri
from tasks.spec import Spec, parse_spec
from tasks.tracking.reader import StoredRun, search_runs
from tasks.tracking.writer import Tracker

TERMINAL_FAILED = {"FAILED", "CRASHED", "CANCELLED"}
POLL_SECONDS = 3.0
# A worker is lost after 5 missed heartbeats and at least a minute: a live worker on a busy host
# (or a Prefect server on SQLite, whose heartbeat writes can fail "database is locked") misses
# some, and declaring a live run CRASHED is worse than noticing a dead one a little later.
MISSED_HEARTBEATS = 5
MIN_SILENCE_S = 60.0


def deployment_name(spec_name: str, pool: str) -> str:
    return f"{spec_name}-sweep@{pool}"


def prepare(spec_path: Path, base_spec: dict[str, Any], pool: str, working_dir: Path) -> str:
    """Check the server and pool, deploy the benchmark flow for this sweep; returns its full name."""
    from flows.schedules import Planned, deploy, ensure_pool, require_server

    require_server()
    ensure_pool(pool, create=False)
    spec = parse_spec(base_spec, "(sweep base spec)")
    name = deployment_name(spec.name, pool)
    deploy([Planned(spec_path.resolve(), name, spec.to_dict(), None, "UTC", spec.spec_hash)], pool, working_dir)
    return f"benchmark/{name}"


def _worker_gone(client: Any, pool: str, worker: str | None) -> bool:
    """True when ``worker`` stopped heart-beating (silent for 5 intervals and at least a minute)."""
    if not worker:
        return False
    for w in client.read_workers_for_work_pool(pool):
        if w.name != worker:
            continue
        interval = w.heartbeat_interval_seconds or 30
        last = w.last_heartbeat_time
        silent = (datetime.now(UTC) - last).total_seconds() if last is not None else 0.0
        return silent > max(MISSED_HEARTBEATS * interval, MIN_SILENCE_S)
    return True  # the worker was deleted


def _child_run(experiment: str, attempt: str, index: int) -> StoredRun | None:
    found = search_runs(
        experiment,
        status=None,
        filter_string=(f"tags.\"relflow.sweep.attempt\" = '{attempt}' and tags.\"relflow.sweep.index\" = '{index}'"),
    )
    return found[-1] if found else None


@dataclass
class Fanout:
    """One pool sweep while it runs: the flow runs it submitted, the rows of those that settled,
    and the worker that ran each configuration."""

    base: Spec
    configs: list[Config]
    shash: str
    attempt: str
    tracker: Tracker
    parent: str
    deployment: str
    pool: str
    queue: str | None
    spec_dir: str
    tags: dict[str, str] | None
    rows: dict[int, Row] = field(default_factory=dict)
    workers: dict[int, str] = field(default_factory=dict)  # config index -> worker that ran it

    def submit(self, done: dict[str | None, Any]) -> dict[int, UUID]:
        """A SKIPPED row for each configuration with a FINISHED child, a flow run of the deployment
        for each other; returns the flow runs by configuration index."""
        pending: dict[int, UUID] = {}
        for c in self.configs:
            if c.spec_hash in done:
                self.rows[c.index] = row_from_record(c, done[c.spec_hash], "SKIPPED", self.base.task.kind)
                self.workers[c.index] = done[c.spec_hash].tags.get("relflow.worker", "-")
                progress.emit("sweep", kind="skipped", row=self.rows[c.index], total=len(self.configs))
                continue
            child_tags = child_run_tags(self.shash, self.attempt, c, self.tags, {"relflow.pool": self.pool})
            fr = run_deployment(
                self.deployment,
                timeout=0,
                work_queue_name=self.queue,
                tags=["relflow", "relflow-sweep"],
                parameters={
                    "spec": c.spec,
                    "spec_dir": self.spec_dir,
                    "parent_run_id": self.parent,
                    "tags": child_tags,
                },
            )
            pending[c.index] = fr.id
            progress.emit(
                "sweep", kind="start", index=c.index, config=f"{c.label} -> flow run {fr.name}", total=len(self.configs)
            )
        return pending

    def wait(self, pending: dict[int, UUID]) -> None:
        """Poll the flow runs until every one has settled, recording each row as it does."""
        by_index = {c.index: c for c in self.configs}
        with get_client(sync_client=True) as client:
            while pending:
                t0 = wall_clock()
                for index, fr_id in list(pending.items()):
                    settled = self.settle(client, by_index[index], fr_id)
                    if settled is None:
                        continue
                    row, worker = settled
                    row.stages = []
                    self.rows[index] = row
                    self.workers[index] = worker or "-"
                    del pending[index]
                    progress.emit("sweep", kind="done", row=row, total=len(self.configs))
                if pending:
                    # Wait between polls (Prefect's own runner polls the same way).
                    time.sleep(max(0.0, POLL_SECONDS - (wall_clock() - t0)))

    def settle(self, client: Any, c: Config, fr_id: UUID) -> tuple[Row, str | None] | None:
        """The row of a flow run that ended and the worker that ran it; None while it runs. A flow
        run whose worker stopped heart-beating is set CRASHED first (its process died with it)."""
        fr = client.read_flow_run(fr_id)
        state = fr.state.type.value if fr.state else "PENDING"
        worker = (fr.labels or {}).get("prefect.worker.name")
        if state in ("RUNNING", "PENDING") and worker and _worker_gone(client, self.pool, worker):
            client.set_flow_run_state(
                fr_id,
                Crashed(message=f"worker '{worker}' stopped sending heartbeats (killed or host lost)"),
                force=True,
            )
            state = "CRASHED"
        if state == "COMPLETED":
            return self.completed_row(c), worker
        if state in TERMINAL_FAILED:
            message = fr.state.message if fr.state else ""
            kind = self.base.task.kind
            return _failed(self.tracker, c, self.attempt, self.parent, kind, state, fr.name, worker, message), worker
        return None

    def completed_row(self, c: Config) -> Row:
        """A COMPLETED flow run's row, from its MLflow child; FAILED when it left none."""
        rec = _child_run(self.base.name, self.attempt, c.index)
        if rec:
            return row_from_record(c, rec, "FINISHED", self.base.task.kind)
        return Row(
            c.index,
            c.label,
            c.values,
            "FAILED",
            None,
            quality_metric=K.HEADLINE_QUALITY[self.base.task.kind],
            error="flow run COMPLETED but no MLflow child run was found",
        )


@flow(name="sweep-pool", persist_result=False, validate_parameters=True)
def sweep_pool(
    base_spec: dict[str, Any],
    grid: dict[str, list[Any]],
    deployment: str,
    pool: str,
    spec_dir: str = ".",
    queue: str | None = None,
    tags: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Fan every grid configuration out as a flow run of ``deployment``; wait and record them."""
    base = parse_spec(base_spec, "(sweep parameter 'base_spec')")
    configs = expand(base, grid)
    shash = sweep_hash(base, configs)
    attempt = uuid.uuid4().hex[:12]
    tracker, parent, reused = open_parent(base, base_spec, grid, len(configs), shash, tags)
    tracker.set_tags(
        {
            "relflow.sweep.pool": pool,
            "relflow.sweep.deployment": deployment,
            **({"relflow.sweep.queue": queue} if queue else {}),
        }
    )
    fanout = Fanout(base, configs, shash, attempt, tracker, parent, deployment, pool, queue, spec_dir, tags)
    try:
        progress.emit("sweep", kind="parent", run_id=parent, reused=reused, sweep_hash=shash, total=len(configs))
        fanout.wait(fanout.submit(finished_children(base.name, parent)))
        ordered = [fanout.rows[c.index] for c in configs]
        close_parent(tracker, ordered, attempt, fanout.workers)
    except BaseException as err:
        tracker.fail(err)
        raise
    return {
        "parent_run_id": parent,
        "experiment": base.name,
        "sweep_hash": shash,
        "reused_parent": reused,
        "tracking_uri": mask_uri(tracker.uri),
        "pool": pool,
        "deployment": deployment,
        "rows": [asdict(r) | {"worker": fanout.workers.get(r.index, "-")} for r in ordered],
    }


def _failed(
    tracker: Tracker,
    c: Config,
    attempt: str,
    parent: str,
    kind: str,
    state: str,
    flow_run: str,
    worker: str | None,
    message: str,
) -> Row:
    """A FAILED row; the MLflow child ends FAILED (created FAILED if the flow never started one)."""

    error = (
        f"flow run {flow_run} ended {state}"
        + (f" on worker '{worker}'" if worker else "")
        + (f": {message}" if message else "")
    )
    rec = _child_run(tracker.experiment, attempt, c.index)
    child = Tracker(tracker.experiment, tracker.uri)
    if rec is None:
        child.start(
            f"{tracker.experiment}-sweep-{c.index}",
            {
                "relflow.spec_hash": c.spec_hash,
                "relflow.sweep.attempt": attempt,
                "relflow.sweep.index": str(c.index),
                "relflow.sweep.role": "child",
                **({"relflow.worker": worker} if worker else {}),
            },
            parent_run_id=parent,
        )
        child.fail(RuntimeError(error))
        run_id = child.run_id
    else:
        run_id = rec.run_id
        if rec.status == "RUNNING":  # the flow-run process died before it could end its run
            child.run_id = run_id
            child.fail(RuntimeError(error))
    return Row(
        c.index,
        c.label,
        c.values,
        "FAILED",
        run_id,
        quality_metric=K.HEADLINE_QUALITY[kind],
        validity=None,
        error=error,
    )


def check_pool_args(pool: str | None, queue: str | None) -> None:
    if queue and not pool:
        raise UserError("--queue pins configurations to a work queue of a pool; pass --pool too (or sweep.pool).")
