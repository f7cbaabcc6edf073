"""A failed write names the file and the fix, not a library's traceback.

A full disk while writing predictions surfaced as Prefect's traceback of an ``OSError`` with
no path. ``named_write_errors`` turns the errors a user fixes outside the program (no space,
quota, file too large, read-only file system) into a ``UserError`` naming the path, what was
being written and the setting that moves it; other ``OSError``s pass unchanged.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tasks.runtime.errors import UserError

FIXABLE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


@contextmanager
def named_write_errors(path: Path, what: str, setting: str) -> Iterator[None]:
    """Inside: an ``OSError`` in ``FIXABLE`` becomes a ``UserError`` naming ``path``."""
    try:
        yield
    except OSError as err:
        if err.errno not in FIXABLE:
            raise
        # The C library's words: pyarrow's strerror is "Error writing bytes to file. Detail: [errno 28] ...".
        reason = os.strerror(err.errno or 0)
        fix = (
            "free space on that disk (df -h shows it)"
            if err.errno in (errno.ENOSPC, errno.EDQUOT)
            else "check the file system's limits"
        )
        raise UserError(
            f"Writing {what} to '{path}' failed: {reason} ({errno.errorcode.get(err.errno or 0, '?')}) "
            f"in '{path.parent}'. Nothing was kept; {fix}, or set {setting} to a folder on another disk."
        ) from None
