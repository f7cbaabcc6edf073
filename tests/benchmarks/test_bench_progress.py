"""bench_progress's parts: a per-call timing counts every call, and its display kinds listen only
while they are live (the bench compares steady batches with and without the line)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_progress import display, per_call_seconds, redraw_seconds  # noqa: E402

from tasks.runtime import progress  # noqa: E402


def test_per_call_seconds_runs_five_loops_of_n_calls():
    calls = []
    assert per_call_seconds(lambda: calls.append(1), 7) >= 0.0
    assert len(calls) == 35


def test_each_display_kind_listens_only_while_live():
    for kind, listens in (("off", False), ("spinner", True), ("count", True)):
        with display(kind):
            assert progress.listening() is listens
        assert not progress.listening()


def test_a_redraw_of_the_line_is_timed():
    assert redraw_seconds(progress.Count("predict", 10, done=3, rows=768)) > 0.0
