"""One benchmark per host: an OS file lock around every timed region.

``flock`` is released by the kernel when the holding process dies, so a killed run never
leaves the host locked (unlike a lease in a server). The wait is measured and reported.

Every user of the host shares the one lock file: it is created world-writable (mode 666,
whatever the umask), and ``flock`` works on a read-only descriptor too, so a lock file that
another user created with a stricter mode still serialises everyone instead of failing
with ``PermissionError``. It is opened without ``O_CREAT`` when it exists, which the
kernel's ``protected_regular`` rule requires for another user's file in sticky ``/tmp``.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tasks.measure.clock import wall_clock
from tasks.runtime.errors import UserError

SHARED_MODE = 0o666


def lock_path() -> Path:
    return Path(os.environ.get("RELFLOW_LOCK_FILE", Path(tempfile.gettempdir()) / "relflow-bench.lock"))


def _open_shared(path: Path) -> int:
    """A descriptor of the lock file that any user of the host can lock."""
    for flags in (os.O_RDWR, os.O_RDONLY):
        try:
            return os.open(path, flags)
        except FileNotFoundError:
            break
        except PermissionError:
            continue
    else:
        raise UserError(
            f"The host lock file '{path}' exists but this user cannot open it (mode "
            f"{path.stat().st_mode & 0o777:o}, owner uid {path.stat().st_uid}). Ask its owner to "
            f"run 'chmod 666 {path}', or set RELFLOW_LOCK_FILE to a lock file every benchmark "
            "user of this host can read."
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, SHARED_MODE)
    except FileExistsError:  # another process created it just now
        return _open_shared(path)
    os.fchmod(fd, SHARED_MODE)  # the umask took bits away; every user needs them
    return fd


def check_lock_file() -> None:
    """Up front, before any work: the lock file can be opened, or created where it is missing.

    Without it a ``RELFLOW_LOCK_FILE`` naming a folder or an unwritable place failed only at
    the timed region, after Prefect's start-up and the MLflow run's creation."""
    path = lock_path()
    fix = "set RELFLOW_LOCK_FILE to a file path every benchmark user of this host can write, or unset it"
    if path.is_dir():
        raise UserError(f"The host lock file '{path}' (RELFLOW_LOCK_FILE) is a folder, not a file; {fix}.")
    if path.exists():
        if not path.is_file():
            raise UserError(f"The host lock file '{path}' (RELFLOW_LOCK_FILE) is not a regular file; {fix}.")
        os.close(_open_shared(path))  # names the owner and mode when it cannot be opened
        return
    probe = path.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(
            f"The host lock file '{path}' (RELFLOW_LOCK_FILE) cannot be created: '{probe}' is not a folder; {fix}."
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(
            f"The host lock file '{path}' (RELFLOW_LOCK_FILE) cannot be created: this user cannot "
            f"write in '{probe}'; {fix}."
        )
    # os.access answers yes to root everywhere, /proc and a root-squashed NFS mount included:
    # a real file is created (and removed) where the lock file will be, leaving nothing behind.
    try:
        fd, name = tempfile.mkstemp(prefix=".relflow-lock-probe-", dir=probe)
    except OSError as err:
        raise UserError(
            f"The host lock file '{path}' (RELFLOW_LOCK_FILE) cannot be created: no file can be "
            f"created in '{probe}' ({err.strerror or err}); {fix}."
        ) from None
    os.close(fd)
    os.unlink(name)


@contextmanager
def host_lock(on_wait: Callable[[], None] | None = None) -> Iterator[float]:
    """Hold the host lock; yields the seconds spent waiting for it.

    ``on_wait`` is called once if another process holds it (``lock_path()`` says where)."""
    path = lock_path()
    with os.fdopen(_open_shared(path), "rb") as fh:
        start = wall_clock()
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fh, fcntl.LOCK_EX)
        waited = wall_clock() - start
        try:
            yield waited
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
