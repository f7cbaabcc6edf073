"""bench_library_footprint's verdict: the goal is met only when the whole interval is inside it."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_library_footprint import goal_verdict  # noqa: E402


def test_met_needs_the_whole_interval_inside_the_goal():
    assert goal_verdict(0.98, 1.02) == "met"
    # the shipped figure 0.991 [0.933, 1.020]: the median is inside 3%, the interval is not
    assert goal_verdict(0.933, 1.020).startswith("unresolved")
    assert goal_verdict(1.04, 1.10) == "missed"
    assert goal_verdict(0.90, 0.96) == "missed"
    assert goal_verdict(None, None).startswith("unresolved")  # too few rounds: no claim
