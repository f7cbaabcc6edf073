"""SIGTERM and SIGINT end a run the same way, however they arrive: exit 130 within seconds,
every MLflow run this process holds ended KILLED, partial outputs removed.

Why not unwind through Python: a signal sent to the whole process group (``timeout``,
systemd, Ctrl-C in a terminal) also kills Prefect's temporary local server, and Prefect's
client then retries its state reports for about 70 s before giving up; and Prefect turns
SIGTERM inside a flow into its own ``TerminationSignal``, which would end the run FAILED.
So the handler does the few things the contract needs itself, talking to MLflow directly,
stops this process's own children (Prefect's temporary server) and leaves with
``os._exit(130)``. A watchdog bounds the whole ending, so a store that hangs cannot hold
the process; a run it could not end is found stale by the next invocation on this host
(``tasks/runtime/liveness.py``).

Runs register themselves (``tasks/tracking/writer.py`` does it for every run it starts) and so do
cleanups of partial files (the benchmark flow registers its outputs).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from tasks.measure.clock import wall_clock

ENDING_LIMIT_S = 8.0  # everything the handler does must fit in the 10 s the contract allows
EXIT_CODE = 130
PREFECT_SERVER = "prefect.server.api.server:create_app"  # its temporary server's command line


class EndsOnInterrupt(Protocol):
    """What the handler ends: ``tasks.tracking.writer.Tracker`` (a lower layer cannot name it)."""

    run_id: str | None

    def fail(self, error: BaseException) -> None: ...


_runs: dict[str, EndsOnInterrupt] = {}
_cleanups: dict[int, Callable[[], None]] = {}
_installed = False
_ending = False
_message = "interrupted: the MLflow run was ended KILLED and partial outputs were removed."


class Interrupted(KeyboardInterrupt):
    """What a run records as its error when a signal ended it."""


def track_run(run_id: str, tracker: EndsOnInterrupt) -> None:
    _runs[run_id] = tracker


def untrack_run(run_id: str | None) -> None:
    _runs.pop(run_id or "", None)


def on_interrupt(cleanup: Callable[[], None]) -> Callable[[], None]:
    """Run ``cleanup`` if a signal ends the process; returns a function that unregisters it."""
    key = id(cleanup)
    _cleanups[key] = cleanup

    def forget() -> None:
        _cleanups.pop(key, None)

    return forget


@contextmanager
def removed_on_exit(cleanup: Callable[[], None]) -> Iterator[None]:
    """``cleanup`` (a temporary file's or folder's removal) when the block ends, however it
    ends: normally, by an error, or by a signal (the handler exits directly, past any
    ``finally``, so it runs the registered cleanup itself)."""
    forget = on_interrupt(cleanup)
    try:
        yield
    finally:
        forget()
        cleanup()


def install(message: str | None = None) -> None:
    """Take over SIGTERM and SIGINT (the CLI calls this once; only the main thread can)."""
    global _installed, _message
    if message:
        _message = message
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, _handle)
    signal.signal(signal.SIGINT, _handle)
    _installed = True


def reinstall() -> None:
    """Inside a flow: take SIGTERM back from Prefect's engine, if the CLI installed us."""
    if _installed:
        install()


def _handle(signum: int, frame: Any) -> None:
    global _ending
    if _ending:  # a second signal while ending: leave now
        os._exit(EXIT_CODE)
    _ending = True
    name = signal.Signals(signum).name
    started = wall_clock()
    watchdog = threading.Timer(ENDING_LIMIT_S, os._exit, args=(EXIT_CODE,))
    watchdog.daemon = True
    watchdog.start()
    # Stop our children first (Prefect's temporary server: nothing may report to it, and it
    # must not outlive us, since os._exit skips its shutdown; a sweep's configuration
    # processes end their own runs KILLED meanwhile), wait for them after our own ending.
    children = _terminate_children()
    for cleanup in list(_cleanups.values()):
        try:
            cleanup()
        except Exception:  # noqa: BLE001 - one failed cleanup must not stop the others
            pass
    for tracker in list(_runs.values()):
        try:
            tracker.fail(Interrupted(f"{name}: the process was interrupted"))
        except Exception as err:  # noqa: BLE001
            print(
                f"could not end MLflow run {tracker.run_id} KILLED ({err}); "
                "the next run on this host marks it KILLED (found stale).",
                file=sys.stderr,
            )
    _reap(children, timeout=max(ENDING_LIMIT_S - 2.0 - (wall_clock() - started), 0.5))
    print(f"interrupted by {name}: {_message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(EXIT_CODE)


def _terminate_children() -> list[Any]:
    try:
        import psutil

        children: list[Any] = psutil.Process().children(recursive=True)
        for child in children:
            try:
                if PREFECT_SERVER in " ".join(child.cmdline()):
                    child.kill()  # asked to stop, it logs the cancelled requests' tracebacks
                else:
                    child.terminate()  # a sweep's configuration, torchrun: end their own runs
            except psutil.Error:
                pass
        return children
    except Exception:  # noqa: BLE001 - children that are already gone need nothing
        return []


def _reap(children: list[Any], timeout: float) -> None:
    """Wait for the children told to stop; kill those still there after ``timeout`` s."""
    try:
        import psutil

        _, alive = psutil.wait_procs(children, timeout=timeout)
        for child in alive:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
    except Exception:  # noqa: BLE001
        pass
