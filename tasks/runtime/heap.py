"""The Python heap held still while requests are served.

Every probe of ``peak-qps`` on the default workload (4 of 4, 10-28 QPS) had one compute step
of 390-445 ms among its first requests, and the early-stopping p99 of 662 requests is the
slowest one; a full (generation 2) collection of the harness's heap took 396-664 ms when
timed in-process. Collecting once before the requests and freezing what survives moves the
harness's, Prefect's and MLflow's objects out of every later collection's walk, so a
collection during the requests only walks what the requests allocated.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Collect, then freeze the survivors for the block; unfreeze after it."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
