"""The floor ledger in the flow: the orchestration floor (a no-op Prefect task call, which
``tasks/`` cannot measure since it never imports Prefect) and a run's ``floor.*`` metrics.

The floors themselves are measured in ``tasks/run/floors.py``, after the timed region.
"""

from __future__ import annotations

from pathlib import Path

import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.libraries import Library
from tasks.measure.clock import Clock
from tasks.measure.environment import fingerprint
from tasks.run.floors import Floor, best_seconds, fractions, ledger
from tasks.sources.tables import Sources
from tasks.spec import Spec

CALLS = 10  # no-op task calls per timed repetition


@task(name="noop", cache_policy=NO_CACHE, persist_result=False, retries=0)
def _noop() -> None:
    """Nothing: what Prefect itself costs per task call."""


def orchestration_floor(clock: Clock) -> Floor:
    """Seconds of ``CALLS`` no-op Prefect task calls at best, as calls per second."""

    def calls() -> None:
        for _ in range(CALLS):
            _noop()

    return Floor("orchestration", float(CALLS), best_seconds(calls, clock), f"{CALLS} no-op Prefect task calls")


def run_floor_metrics(
    spec: Spec,
    sources: Sources,
    device: torch.device,
    metrics: dict[str, float],
    task_calls: int,
    predictions: Path | None = None,
    threads: int | None = None,
    library: Library | None = None,
) -> dict[str, float]:
    """A finished run's ``floor.*`` metrics against this host's (cached) ledger; measured
    after the timed region on a miss (``predictions``: the run's committed prediction file,
    the write floor's table, so no forward pass is spent making one), at ``threads``, the
    intra-op threads its predict compute ran at (``invocation.predict_threads``; None: the
    spec's, ``serving_threads``)."""
    host = fingerprint(device)["relflow.host_fingerprint"]
    led = ledger(
        spec, sources, device, host, orchestration_floor, predictions=predictions, threads=threads, library=library
    )
    return fractions(led, metrics, task_calls)
