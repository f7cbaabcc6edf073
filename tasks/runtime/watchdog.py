"""No child of the CLI outlives it, however the CLI ends (SIGKILL and the out-of-memory killer
included).

A killed process cannot stop its children: Prefect's temporary server stayed alive as an
orphan when the CLI was SIGKILLed. Process groups do not cover it (torchrun's ranks and the
sweep's configurations start their own sessions, and the CLI must stay in the terminal's
group for Ctrl-C), ``PR_SET_PDEATHSIG`` would need hooks in every library that starts a
process and fires when the forking *thread* ends, and a killed parent's orphans are
re-parented, so they can no longer be found by walking the process tree.

So the CLI marks its environment: ``RELFLOW_CLI_OWNERS`` holds ``<pid>@<start time>`` of
every CLI process above, and every child inherits it (Prefect's server, MLflow's UI,
torchrun and its ranks, a sweep's configurations, which add their own mark). At start
the CLI launches this file as a small watcher in a session of its own (a signal to the
CLI's process group does not reach it) that waits for the CLI to exit (a pidfd: woken at
once) and then ends every process still carrying the CLI's mark: Prefect's server is killed
(asked to stop, it logs tracebacks), the others get SIGTERM (a sweep's configuration ends
its own MLflow run KILLED) and SIGKILL after ``GRACE_S``. A normal exit finds nothing left.

A process the CLI *forks* without exec (a DataLoader worker, a ``multiprocessing`` fork) does
not show the mark: ``/proc/<pid>/environ`` is the environment at exec time, and the CLI set
its mark after that. So the CLI registers an at-fork hook: each such child appends its own
``<pid>@<start ticks>`` to ``forks_file(token)`` (created by the first fork only), and the
watcher ends those too (pid and start time must both match: pids are reused), then removes
the file.

Run as a script (``python watchdog.py PID MARK``) it imports only the standard library and
psutil, so it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

OWNERS_ENV = "RELFLOW_CLI_OWNERS"
GRACE_S = 5.0
PREFECT_SERVER = "prefect.server.api.server:create_app"  # its temporary server's command line


def mark(pid: int) -> str:
    """``<pid>@<start time>``: a pid alone could be reused by an unrelated process."""
    return f"{pid}@{psutil.Process(pid).create_time():.3f}"


def forks_file(token: str) -> Path:
    """Where the CLI's forked children (``token`` is the CLI's mark) record themselves."""
    return Path(tempfile.gettempdir()) / f"relflow-cli-{token}.forks"


def _start_ticks(pid: int) -> str:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), read
    with bare system calls: the at-fork hook may run between fork and exec in a threaded
    process, where taking a lock (psutil's, the import lock) could hang the child."""
    fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    try:
        stat = os.read(fd, 4096)
    finally:
        os.close(fd)
    return stat[stat.rindex(b")") + 2 :].split()[19].decode()  # after "(comm)": fields 3, 4, ...


def _record_fork(path: Path) -> None:
    """At-fork hook, in the new child: append ``<pid>@<start ticks>`` (one short O_APPEND write,
    so forks at the same time do not interleave)."""
    try:
        pid = os.getpid()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{pid}@{_start_ticks(pid)}\n".encode())
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):  # the child's own work matters more than its record
        pass


def start() -> subprocess.Popen[bytes] | None:
    """Mark this process's environment and start its watcher (the CLI's entry calls it once)."""
    me = mark(os.getpid())
    owners = os.environ.get(OWNERS_ENV, "").split()
    if me in owners:
        return None  # already watched (main() called twice in one process)
    os.environ[OWNERS_ENV] = " ".join([*owners, me])
    forks = forks_file(me)
    os.register_at_fork(after_in_child=lambda: _record_fork(forks))
    env = {k: v for k, v in os.environ.items() if k != OWNERS_ENV}  # the watcher is not ours to end
    try:
        return subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid()), me],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:  # no watcher is no reason to refuse the command
        return None


def _wait_for_exit(pid: int, token: str) -> None:
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # old kernel: poll
        while True:
            try:
                if mark(pid) != token:
                    return
            except psutil.Error:
                return
            time.sleep(0.5)
    else:
        select.select([fd], [], [])
        os.close(fd)


def owned(token: str) -> list[psutil.Process]:
    """Processes still carrying ``token`` in their ``RELFLOW_CLI_OWNERS``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if token in proc.environ().get(OWNERS_ENV, "").split():
                found.append(proc)
        except psutil.Error:  # gone, a zombie, or another user's: not ours
            continue
    return found


def forked(token: str) -> list[psutil.Process]:
    """The CLI's forked children recorded in ``forks_file(token)`` that still run."""
    try:
        lines = forks_file(token).read_text().split()
    except OSError:  # no fork, no file
        return []
    found = []
    for line in dict.fromkeys(lines):
        try:
            pid = int(line.split("@", 1)[0])
            if f"{pid}@{_start_ticks(pid)}" == line:  # the same process, not a reused pid
                found.append(psutil.Process(pid))
        except (OSError, ValueError, IndexError, psutil.Error):  # gone, or not ours
            continue
    return found


def end(procs: list[psutil.Process]) -> None:
    for proc in procs:
        try:
            if PREFECT_SERVER in " ".join(proc.cmdline()):
                proc.kill()
            else:
                proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=GRACE_S)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass


def main(argv: list[str]) -> None:
    pid, token = int(argv[1]), argv[2]
    _wait_for_exit(pid, token)
    try:
        for _ in range(3):  # a child may have started another process meanwhile
            procs = owned(token) + forked(token)
            if not procs:
                return
            end(procs)
    finally:
        forks_file(token).unlink(missing_ok=True)


if __name__ == "__main__":
    main(sys.argv)
