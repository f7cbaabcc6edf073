"""Progress counts (tasks/runtime/progress.py): with no listener nothing is opened and a tick
does nothing; with one, a tick adds to the open count and nothing else (the display reads it)."""

from __future__ import annotations

from typing import Any

from tasks.runtime import progress


def test_without_a_listener_begin_opens_nothing_and_tick_does_nothing():
    assert not progress.listening()
    assert progress.begin("predict", 10) is None
    progress.tick(256)
    assert progress._count is None


def test_a_listener_gets_the_count_once_and_ticks_only_add_to_it():
    events: list[tuple[str, dict[str, Any]]] = []
    unsubscribe = progress.subscribe(lambda event, info: events.append((event, info)))
    try:
        count = progress.begin("train", 7, exact=False)
        for rows in (4, 4, 3):
            progress.tick(rows)
        progress.tick(2, steps=2)
    finally:
        unsubscribe()
        progress.end()
    assert count is not None and (count.done, count.rows, count.total, count.exact) == (5, 13, 7, False)
    assert events == [("count", {"count": count})]  # the ticks sent nothing
    assert progress._count is None
