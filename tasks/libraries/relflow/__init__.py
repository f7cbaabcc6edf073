"""relflow 0.4.0 as the model under test (``model.library: relflow``).

``mapping``: the spec checked against what relflow can honour, the harness's nested table
as relflow reads it, and the relflow ``Model`` built from the spec. ``driver``: what the
harness's compute engine calls per batch (encode, train step, predict, write) and the facts
it reports (occupancy, packing, compiled region calls, throughput estimate, FLOPs).
See README.md in this folder for the mapping table and the measured findings.
"""

from __future__ import annotations

import os

import relflow
from relflow.logging.config import configure

from tasks.spec import Spec

# relflow logs at DEBUG unless RELFLOW_LOG_LEVEL says otherwise (relflow/logging/config.py),
# one stderr line per model build, checkpoint and warning path; the harness keeps a user's
# explicit setting and otherwise logs relflow's warnings only.
configure(level=os.environ.get("RELFLOW_LOG_LEVEL", "WARNING"))

from tasks.libraries.relflow.driver import (  # noqa: E402
    CompiledCalls,
    FieldOccupancy,
    MemoryLogger,
    Occupancy,
    PackingFact,
    RelflowDriver,
    ThroughputRows,
    throughput_rows,
)
from tasks.libraries.relflow.mapping import LIBRARY, build, check, input_table, problems  # noqa: E402

__all__ = [
    "CompiledCalls",
    "FieldOccupancy",
    "MemoryLogger",
    "Occupancy",
    "PackingFact",
    "Relflow",
    "RelflowDriver",
    "ThroughputRows",
    "build",
    "check",
    "input_table",
    "problems",
    "throughput_rows",
]


class Relflow:
    """The ``Library`` (tasks/libraries/base.py) for relflow."""

    name = LIBRARY
    distribution: str | None = "relflow"
    version = relflow.__version__

    def check(self, spec: Spec) -> None:
        check(spec)
