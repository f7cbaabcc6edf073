"""Python's cyclic garbage collector and the timed region: frozen out of it, and timed.

A full collection walks every object the collector tracks: about 525,000 in a run's process
(torch, Prefect, MLflow, Polars and DuckDB loaded), 0.56-0.70 s a collection on this 2-core
VM under load. One that landed in a default predict pass (about 2 s) would move that run's
``e2e.predict.rows_per_s`` by a quarter, and whether one lands depends on how many objects
the process allocated before: a noise source between fresh-process runs that has nothing to
do with the model (measured on default predict runs: none landed; see tasks/measure/README).

``frozen_collector`` collects once and ``gc.freeze()``s just before the region: what is alive
then (the imports, the plan, the engine) moves to the permanent generation, so collections
inside the region scan only what the region itself allocated (after the freeze a full
collection took 3 microseconds). The collector stays enabled: a long-lived serving process
collects too, and ``gc.freeze`` is the standard way such a process keeps its start-up
objects out of it. Every collection that still runs inside is timed through ``gc.callbacks``
on the region clock's raw reads (never a device sync inside a collection):
``harness.region_gc_seconds`` and ``harness.region_gc_collections``. They are not a bucket:
a pause falls inside whichever bucket was running (mostly a stage), so they say how much of
the region was the collector, wherever it hit. The collect before the freeze runs before the
region starts, outside every figure of it; the freeze is undone when the region ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tasks.measure import keys as K
from tasks.measure.clock import Clock


@dataclass
class GcPauses:
    """Collections that ran while the region did, and their seconds."""

    collections: int = 0
    seconds: float = 0.0

    def metrics(self) -> dict[str, float]:
        return {K.HARNESS_REGION_GC_SECONDS: self.seconds, K.HARNESS_REGION_GC_COLLECTIONS: float(self.collections)}


@contextmanager
def frozen_collector(clock: Clock) -> Iterator[GcPauses]:
    """Collect and freeze before the block; time every collection inside it."""
    gc.collect()
    gc.freeze()
    pauses = GcPauses()
    started: list[float] = []

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started.append(clock.now())
        elif started:
            pauses.seconds += clock.now() - started.pop()
            pauses.collections += 1

    gc.callbacks.append(timed)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(timed)
        gc.unfreeze()
