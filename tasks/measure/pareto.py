"""The Pareto front of a context-size budget: quality up, cost down, intervals respected.

``relflow-bench budget`` (flows/sweeps/budget.py) measures one point per context size: a
quality figure with its 95% interval and a cost (end-to-end milliseconds per prediction).
A point is on the front when no other point **dominates** it, and the rule is exact:

    p dominates q  <=>  p's quality interval lies wholly on the better side of q's
                        (higher is better: p.low > q.high; lower is better: p.high < q.low)
                    and p's cost <= q's cost.

So two points whose quality intervals overlap (closed intervals: touching counts as
overlapping) are **not ranked against each other** in either direction, whatever their costs:
their qualities are not told apart, and a cheaper point cannot push out a point whose quality
might be better. A point whose quality has no interval is ranked on its figure alone (the
interval ``[q, q]``). A point with no quality or no cost (a failed run) is not ranked: it is
never on the front and dominates nothing. Equal costs with disjoint intervals: the better
quality dominates. The front is the ranked points no other point dominates; each dominated
point keeps the points that dominate it. Pure functions, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    """One budget point: its quality figure and interval, and its cost."""

    label: str
    quality: float | None
    cost: float | None  # milliseconds per prediction, lower is better
    low: float | None = None
    high: float | None = None

    @property
    def ranked(self) -> bool:
        """Whether the point takes part: a finite quality and cost."""
        return _finite(self.quality) and _finite(self.cost)

    def interval(self) -> tuple[float, float]:
        """The quality interval; ``[q, q]`` when none was measured."""
        assert self.quality is not None
        if _finite(self.low) and _finite(self.high):
            assert self.low is not None and self.high is not None
            return self.low, self.high
        return self.quality, self.quality


def _finite(x: float | None) -> bool:
    return x is not None and not math.isnan(x) and not math.isinf(x)


def overlap(p: Point, q: Point) -> bool:
    """Whether the two closed quality intervals share a value (touching counts)."""
    (pl, ph), (ql, qh) = p.interval(), q.interval()
    return pl <= qh and ql <= ph


def dominates(p: Point, q: Point, higher_is_better: bool = True) -> bool:
    """Whether ``p`` dominates ``q`` under the module's rule."""
    if p is q or not (p.ranked and q.ranked) or overlap(p, q):
        return False
    (pl, ph), (ql, qh) = p.interval(), q.interval()
    better = pl > qh if higher_is_better else ph < ql
    assert p.cost is not None and q.cost is not None
    return better and p.cost <= q.cost


@dataclass(frozen=True)
class Ranked:
    """A point's place: on the front or not, and which points (by index) dominate it."""

    on_front: bool
    ranked: bool
    dominated_by: tuple[int, ...]


def front(points: Sequence[Point], higher_is_better: bool = True) -> list[Ranked]:
    """Each point's place, in the order given (quadratic: a budget has a few dozen points)."""
    out = []
    for j, q in enumerate(points):
        by = tuple(i for i, p in enumerate(points) if i != j and dominates(p, q, higher_is_better))
        out.append(Ranked(on_front=q.ranked and not by, ranked=q.ranked, dominated_by=by))
    return out
