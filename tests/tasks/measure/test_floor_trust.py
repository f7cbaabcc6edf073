"""Untrusted floors (tasks/measure/floor_trust.py): a busy host's ledger or a stage faster
than its floor marks the fractions, with the numbers that made it so."""

from __future__ import annotations

from tasks.measure import keys as K
from tasks.measure.floor_trust import untrusted
from tasks.measure.hostload import BUSY_HOST_FRACTION


def test_a_quiet_ledger_with_every_stage_below_its_floor_is_trusted():
    m = {K.FLOOR_OTHER_CPU_FRACTION: 0.05, K.floor_fraction("compute"): 0.29, K.floor_fraction("write"): 1.0}
    assert untrusted(m) == []
    assert untrusted({}) == []  # no ledger, nothing to doubt


def test_the_busy_host_run_of_the_issue_is_untrusted_for_each_reason():
    # the run the issue quotes: measured while other work held the cores, two stages "above" their floor
    m = {
        K.FLOOR_OTHER_CPU_FRACTION: 0.37,
        K.floor_fraction("compute"): 1.51,
        K.floor_fraction("tensorize"): 1.43,
        K.floor_fraction("retrieve"): 0.12,
    }
    reasons = untrusted(m)
    assert len(reasons) == 3
    assert reasons[0].startswith(f"floor.other_cpu_fraction 0.37 > {BUSY_HOST_FRACTION}")
    assert any(r.startswith("floor.compute.fraction 1.51 > 1") for r in reasons)
    assert any(r.startswith("floor.tensorize.fraction 1.43 > 1") for r in reasons)
    assert not any("retrieve" in r for r in reasons)
    assert all("--remeasure" in r for r in reasons)  # how to fix it


def test_one_stage_above_its_floor_on_a_quiet_host_is_enough():
    (reason,) = untrusted({K.FLOOR_OTHER_CPU_FRACTION: 0.0, K.floor_fraction("write"): 1.02})
    assert reason.startswith("floor.write.fraction 1.02 > 1")
