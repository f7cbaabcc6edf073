"""Prefect's temporary server under ``relflow-bench run``: its task-run recorder keeps up with
the run, and the process waits for it before the server stops.

Without ``PREFECT_API_URL`` Prefect starts a temporary server for the process and an exit
handler stops it (SIGTERM). The server's task-run recorder turns the task-run events the
client streams to it into task-run rows; on shutdown Prefect cancels it at once: a write in
flight is logged as ``ERROR ... task_run_recorder - Error flushing 1 events`` with a
CancelledError traceback, and the events it has not consumed yet are dropped. With Prefect's
default of one SQLite transaction per event the recorder ran seconds behind a run on a busy
2-core host, so a run ended with ~130 lines of tracebacks after its summary and Prefect's
database lacked most of the run's last task runs (54 of 70: the floor ledger's no-op calls
come last). Issue 35; tests/flows/cli/test_temporary_server.py.

- ``configure()``: the recorder writes what arrived each second in one transaction, so it
  keeps up (and the temporary server costs the measured host fewer commits); the event store
  writes each second too, so the wait below takes about a second.
- ``recorded(flow)``: after the flow run ends (completed or failed), the CLI waits until the
  temporary server has recorded every task run of it in a final state, then lets the process
  exit and Prefect stop the server with nothing left to write.

Prefect keeps no count of a flow run's task runs on the client (a sync task run is known to
the server only through its events), so the count comes from the server's event store: a
marker event sent after the flow run, on the same stream as its task-run events, shows when
the store holds all of them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from rich.markup import escape

from flows.cli.common import console
from tasks.runtime import progress

# Read by the server process Prefect starts (it inherits this process's environment), so they
# must be set before the first Prefect API call; a user's own values win.
SERVER_SETTINGS = {
    # batch_size 1 (the default) is a transaction per event. A batch is written when it is full or
    # at each flush interval, so with a batch larger than a second's events the interval's tick
    # is the recorder's only writer, in arrival order: once the last task run's final state is
    # recorded, nothing is left to write.
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "1000",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",  # whole seconds (Prefect truncates)
    # The event store shows the marker within a second, not five (its default).
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL": "1",
}
MARKER = "relflow.cli.flow-run-ended"
WAIT_SECONDS = 60.0
POLL_SECONDS = 0.2
FINAL_STATES = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def configure() -> None:
    for name, value in SERVER_SETTINGS.items():
        os.environ.setdefault(name, value)


@contextmanager
def recorded(flow: Any) -> Iterator[Any]:
    """``flow`` with hooks that note its flow run; on leaving (after a completed or failed flow
    run, not on an interrupt) ``settle`` it."""
    ended: list[Any] = []

    def note(_flow: Any, flow_run: Any, _state: Any) -> None:
        ended.append(flow_run)

    hooked = flow.with_options(
        on_completion=[*flow.on_completion_hooks, note], on_failure=[*flow.on_failure_hooks, note]
    )
    try:
        yield hooked
    except Exception:
        _settle_last(ended)
        raise
    _settle_last(ended)


def _settle_last(ended: list[Any]) -> None:
    if not ended:
        return
    try:
        settle(ended[-1].id, ended[-1].created)
    except Exception as err:  # the run's own outcome stands (a failed run's error is not replaced)
        console.print(f"[yellow]warning:[/] could not wait for Prefect's task-run records: {escape(str(err))}")


def settle(flow_run_id: UUID, created: datetime | None) -> None:
    """Wait for the records of a flow run's task runs when the process uses the temporary
    server; not when it uses a server of its own (``PREFECT_API_URL``: that one outlives the
    process) or the services the wait reads are off."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    services = settings.server.services
    if settings.api.url is None and services.task_run_recorder.enabled and services.event_persister.enabled:
        progress.emit("phase", name="waiting for Prefect to record the task runs")
        wait_for_records(flow_run_id, created)


def wait_for_records(flow_run_id: UUID, created: datetime | None, timeout: float = WAIT_SECONDS) -> int | None:
    """The number of task runs of ``flow_run_id`` (created at ``created``) once the API's server
    has recorded every one of them in a final state; None, with a warning, after ``timeout``."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        TaskRunFilter,
        TaskRunFilterFlowRunId,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.events import emit_event
    from prefect.events.filters import (
        EventFilter,
        EventIDFilter,
        EventNameFilter,
        EventOccurredFilter,
        EventRelatedFilter,
    )

    flow_run = f"prefect.flow-run.{flow_run_id}"
    marker = emit_event(
        event=MARKER,
        resource={"prefect.resource.id": f"relflow.cli.{uuid4()}"},
        related=[{"prefect.resource.id": flow_run, "prefect.resource.role": "flow-run"}],
    )
    if marker is None:  # this client sends no events, so the server has no task runs to record
        return 0
    # The events' clocks are the client's; without a creation time, the filter's default (a day).
    since = {"since": created - timedelta(minutes=5)} if created is not None else {}
    final = TaskRunFilter(
        flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run_id]),
        state=TaskRunFilterState(type=TaskRunFilterStateType(any_=[StateType(s) for s in FINAL_STATES])),
    )
    deadline = time.monotonic() + timeout

    def until(done: Callable[[], bool]) -> bool:
        while not done():
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_SECONDS)
        return True

    with get_client(sync_client=True) as client:

        def events(**filters: Any) -> int:
            return client.read_events(EventFilter(occurred=EventOccurredFilter(**since), **filters), limit=1).total

        # The event store writes in arrival order, so once it holds the marker it holds every
        # task-run event sent before it: each task run's one Pending event counts it.
        if until(lambda: events(id=EventIDFilter(id=[marker.id])) > 0):
            started = events(
                event=EventNameFilter(name=["prefect.task-run.Pending"]), related=EventRelatedFilter(id=[flow_run])
            )
            body = {"task_runs": final.model_dump(mode="json")}
            if until(lambda: int(client.request("POST", "/task_runs/count", json=body).json()) >= started):
                return started
    console.print(
        f"[yellow]warning:[/] Prefect's server had not recorded the task runs of flow run "
        f"{escape(str(flow_run_id))} after {timeout:.0f} s; a temporary server stops without the rest."
    )
    return None
