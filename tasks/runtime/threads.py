"""Torch thread settings: applied only when the spec asks, always recorded.

Leaving torch's own thread setting alone is the default (``run.threads`` unset), because an
explicit setting is not a no-op even when it equals the default (see the README's
measurement rules); whatever was in force, and whether the harness set it, lands in the
run's tags so an outside measurement can reproduce it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from tasks.runtime.errors import UserError

# Environment that changes how torch's OpenMP / MKL / oneDNN pools run.
THREAD_ENV = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
    "OMP_PROC_BIND",
    "OMP_PLACES",
    "KMP_BLOCKTIME",
    "KMP_AFFINITY",
)


def apply_threads(intra_op: int | None, inter_op: int | None) -> dict[str, str]:
    """Set what the spec asks for (nothing by default) and return the tags of what is in force."""
    if inter_op is not None and torch.get_num_interop_threads() != inter_op:
        try:
            torch.set_num_interop_threads(inter_op)
        except RuntimeError as err:  # torch allows it only before any inter-op work
            raise UserError(
                f"run.threads.inter_op={inter_op} cannot be applied: {err}. Leave it unset, or set "
                "it in a fresh process (the CLI does), or export OMP_NUM_THREADS instead."
            ) from None
    if intra_op is not None:
        torch.set_num_threads(intra_op)
    return thread_tags(set_by_harness=intra_op is not None or inter_op is not None)


def thread_tags(set_by_harness: bool) -> dict[str, str]:
    tags = {
        "relflow.threads.intra_op": str(torch.get_num_threads()),
        "relflow.threads.inter_op": str(torch.get_num_interop_threads()),
        "relflow.threads.set_by_harness": str(set_by_harness).lower(),
    }
    for name in THREAD_ENV:
        tags[f"relflow.env.{name}"] = os.environ.get(name, "unset")
    return tags


@contextmanager
def intra_op_threads(n: int | None) -> Iterator[int]:
    """torch's intra-op thread count set to ``n`` (None: left as it is) inside the block, and
    put back after it; yields the count in force, read back from torch."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
