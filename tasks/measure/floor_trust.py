"""Whether a run's floor fractions can be read as they are.

``floor.<stage>.fraction`` (tasks/run/floors.py) is a stage's rate over its floor's. A
ledger measured while other work held the cores ran slower than this host can, so every
fraction against it reads too high; a stage faster than its floor (fraction above 1) means the
floor, not the stage, is wrong. Either way the run's own stage figures stay right (the floors
are measured after the timed region), so this marks the fractions, never the run's validity:
tag ``relflow.floor.untrusted``, the CLI's "vs floor" column, the dashboard's floor ledger.
Torch-free, so the dashboards can ask too.
"""

from __future__ import annotations

from collections.abc import Mapping

from tasks.measure import keys as K
from tasks.measure.hostload import BUSY_HOST_FRACTION

UNTRUSTED_TAG = "relflow.floor.untrusted"  # the reasons, "; "-joined; set only when there are some


def untrusted(m: Mapping[str, float]) -> list[str]:
    """Why a run's ``floor.<stage>.fraction`` figures stand on floors that are not floors
    (empty: they can be read as they are; a run without a ledger has none)."""
    reasons = []
    other = m.get(K.FLOOR_OTHER_CPU_FRACTION, 0.0)
    if other > BUSY_HOST_FRACTION:
        reasons.append(
            f"{K.FLOOR_OTHER_CPU_FRACTION} {other:.2f} > {BUSY_HOST_FRACTION}: the floors were measured while "
            "other processes held the cores (relflow-bench floors --remeasure on a quiet host)"
        )
    for stage in K.FLOOR_STAGES:
        value = m.get(K.floor_fraction(stage), 0.0)
        if value > 1.0:
            reasons.append(
                f"{K.floor_fraction(stage)} {value:.2f} > 1: the stage ran faster than its floor, so the floor "
                "is wrong (relflow-bench floors --remeasure on a quiet host)"
            )
    return reasons
