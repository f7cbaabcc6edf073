"""The budget's Pareto rule on hand-made points with a known answer (tasks/measure/pareto.py)."""

from __future__ import annotations

import math

from tasks.measure.pareto import Point, dominates, front, overlap


def _front(points, higher_is_better=True):
    return [p.label for p, r in zip(points, front(points, higher_is_better), strict=True) if r.on_front]


def test_disjoint_intervals_rank_by_quality_and_cost():
    # a: best quality, dearest; b: worse, cheaper; c: worse than a AND dearer than a; d: as
    # good as b's interval allows but dearer than b
    pts = [
        Point("a", 0.80, 10.0, 0.78, 0.82),
        Point("b", 0.70, 2.0, 0.68, 0.72),
        Point("c", 0.60, 12.0, 0.58, 0.62),
        Point("d", 0.60, 5.0, 0.58, 0.62),
    ]
    ranks = front(pts)
    assert _front(pts) == ["a", "b"]
    assert ranks[2].dominated_by == (0, 1)  # c: a (better, cheaper) and b (better, cheaper)
    assert ranks[3].dominated_by == (1,)  # d: b only (a is dearer than d)


def test_overlapping_intervals_are_not_ranked_against_each_other_whatever_the_cost():
    # b's interval overlaps a's: b is 10x dearer and its figure lower, yet a does not push it out
    pts = [Point("a", 0.75, 1.0, 0.70, 0.80), Point("b", 0.72, 10.0, 0.65, 0.71)]
    assert overlap(*pts)
    assert not dominates(pts[0], pts[1]) and not dominates(pts[1], pts[0])
    assert _front(pts) == ["a", "b"]
    # once the intervals separate, the cheaper better point dominates
    pts[1] = Point("b", 0.62, 10.0, 0.55, 0.69)
    assert _front(pts) == ["a"]


def test_touching_intervals_count_as_overlapping():
    pts = [Point("a", 0.8, 1.0, 0.7, 0.9), Point("b", 0.6, 2.0, 0.5, 0.7)]
    assert overlap(*pts) and _front(pts) == ["a", "b"]


def test_overlap_is_per_pair_not_transitive():
    # a overlaps b, b overlaps c, a and c are disjoint: only a over c is ranked
    pts = [
        Point("a", 0.80, 3.0, 0.75, 0.85),
        Point("b", 0.72, 2.0, 0.66, 0.78),
        Point("c", 0.60, 4.0, 0.55, 0.65),
    ]
    r = front(pts)
    assert _front(pts) == ["a", "b"]
    assert r[2].dominated_by == (0, 1)  # b too: 0.66 > 0.65 and cheaper


def test_equal_cost_disjoint_quality_the_better_dominates():
    pts = [Point("a", 0.9, 5.0, 0.88, 0.92), Point("b", 0.8, 5.0, 0.78, 0.82)]
    assert _front(pts) == ["a"]


def test_lower_is_better_quality_reverses_the_interval_test():
    # nmae: lower is better
    pts = [
        Point("a", 0.60, 4.0, 0.58, 0.62),
        Point("b", 0.70, 5.0, 0.68, 0.72),
        Point("c", 0.61, 9.0, 0.57, 0.65),
    ]
    r = front(pts, higher_is_better=False)
    assert _front(pts, higher_is_better=False) == ["a", "c"]  # c overlaps a, so a cannot push it out
    assert r[1].dominated_by == (0,)
    # the same points read as higher-is-better: b (highest, disjoint from a) is on the front
    assert "b" in _front(pts, higher_is_better=True)


def test_no_interval_is_a_point_interval_and_failed_points_are_not_ranked():
    pts = [
        Point("a", 0.80, 2.0),  # no interval: [0.80, 0.80]
        Point("b", 0.79, 3.0),
        Point("failed", None, None),
        Point("nan", math.nan, 1.0),
        Point("no-cost", 0.99, None),
    ]
    r = front(pts)
    assert _front(pts) == ["a"]
    assert r[1].dominated_by == (0,)
    assert [x.ranked for x in r] == [True, True, False, False, False]
    assert all(x.dominated_by == () for x in r[2:])  # unranked: dominated by nothing, dominate nothing
