"""No child of the CLI outlives it (tasks/runtime/watchdog.py, issue 24), without Prefect.

A stand-in for the CLI (``watchdog.start()`` as ``flows.cli.app.main`` calls it) starts the
three kinds of children the real CLI has: a subprocess (Prefect's temporary server, MLflow's
UI), a subprocess in a session of its own (torchrun, whose ranks start their own sessions)
and a forked child that never execs (a DataLoader worker). Each ends the CLI by a different
path; every child must be gone within seconds. The end-to-end case (a real ``run``, its
Prefect server, SIGKILL) is tests/flows/cli/test_app_secrets_and_orphans.py (slow).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from tasks.runtime import watchdog

CLI = """
import os, subprocess, sys, time
from tasks.runtime import watchdog
watchdog.start()
sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
kids = [subprocess.Popen(sleep), subprocess.Popen(sleep, start_new_session=True)]
fork = os.fork()  # as multiprocessing's "fork" and DataLoader workers do: no exec
if fork == 0:
    time.sleep(120)
    os._exit(0)
print(" ".join(str(p) for p in [k.pid for k in kids] + [fork]), flush=True)
how = sys.stdin.readline().strip()
if how == "os_exit":
    os._exit(130)  # how tasks/runtime/interrupts.py ends an interrupted run: no atexit, no cleanup
if how == "raise":
    raise RuntimeError("the command failed")
time.sleep(120)  # "sigkill": the test kills this process
"""

WITHIN_S = 10  # the watcher is woken by a pidfd; GRACE_S (5 s) bounds a child that ignores SIGTERM


@pytest.mark.parametrize("how", ["sigkill", "os_exit", "raise"])
def test_no_child_outlives_the_cli(how):
    cli = subprocess.Popen(
        [sys.executable, "-c", CLI], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert cli.stdout is not None and cli.stdin is not None
    pids = [int(p) for p in cli.stdout.readline().split()]
    assert len(pids) == 3, "the stand-in did not start its children"
    children = [psutil.Process(p) for p in pids]
    (watcher,) = [c for c in psutil.Process(cli.pid).children() if "watchdog.py" in " ".join(c.cmdline())]
    token = watchdog.mark(cli.pid)
    if how == "sigkill":
        os.kill(cli.pid, signal.SIGKILL)
    else:
        cli.stdin.write(how + "\n")
        cli.stdin.flush()
    cli.wait(timeout=30)
    _, alive = psutil.wait_procs(children, timeout=WITHIN_S)
    try:
        kinds = dict(zip(pids, ["subprocess", "own session", "fork"], strict=True))
        assert not alive, [kinds[p.pid] for p in alive]
    finally:
        for p in alive:
            p.kill()
    _, watching = psutil.wait_procs([watcher], timeout=WITHIN_S)
    assert not watching, "the watcher did not end"
    assert not watchdog.forks_file(token).exists(), "the watcher left its record of forks behind"


def test_a_recorded_fork_is_ended_only_while_its_pid_names_the_same_process(tmp_path, monkeypatch):
    """Pids are reused: a record whose start time no longer matches names someone else's process."""
    monkeypatch.setattr(watchdog.tempfile, "gettempdir", lambda: str(tmp_path))
    me = os.getpid()
    path = watchdog.forks_file("cli@1.000")
    path.write_text(f"{me}@1\n")  # this pid, but a process that started one tick after boot
    assert watchdog.forked("cli@1.000") == []
    watchdog._record_fork(path)  # as the at-fork hook writes it, for this process
    assert [p.pid for p in watchdog.forked("cli@1.000")] == [me]
