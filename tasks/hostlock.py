"""One benchmark per host: an OS file lock around every timed region.

``flock`` is released by the kernel when the holding process dies, so a killed run never
leaves the host locked (unlike a lease in a server). The wait is measured and reported.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tasks.clock import wall_clock


def lock_path() -> Path:
    return Path(os.environ.get("RELFLOW_LOCK_FILE", Path(tempfile.gettempdir()) / "relflow-bench.lock"))


@contextmanager
def host_lock(on_wait: Callable[[], None] | None = None) -> Iterator[float]:
    """Hold the host lock; yields the seconds spent waiting for it."""
    path = lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
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
