"""``run``'s progress line (flows/cli/app.py ``_progress_line``): counts, rows/s and time left
on a terminal; on anything else (a pipe, a log file, CI) nothing is shown and nothing listens,
so the run's loops count nothing (tasks/runtime/progress.py)."""

from __future__ import annotations

import io
import re

from rich.console import Console

from flows.cli.app import _CountColumn, _progress_line, _projection_line, _Shown, count_text
from tasks.measure import keys as K
from tasks.runtime import progress


def test_a_non_terminal_stderr_shows_nothing_and_nothing_listens():
    stderr = io.StringIO()
    con = Console(file=stderr, force_terminal=False)
    with _progress_line("shop", shown_on=con):
        assert not progress.listening()
        assert progress.begin("predict", 10) is None  # no count: the loops' ticks do nothing
        progress.emit("phase", name="checking inputs")
        progress.emit("projection", text="projected 9.0 s", seconds=9.0)
    assert stderr.getvalue() == ""


def test_a_terminal_gets_the_count_and_the_projection():
    stderr = io.StringIO()
    con = Console(file=stderr, force_terminal=True, width=200)
    with _progress_line("shop", shown_on=con):
        assert progress.listening()
        count = progress.begin("train", 8)
        assert count is not None
        progress.tick(4)
        progress.emit("projection", text="projected 9.0 s of timed region", seconds=9.0)
    progress.end()
    assert not progress.listening()
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", stderr.getvalue())
    assert "shop: projected 9.0 s of timed region" in shown
    assert "1/8 batches (train)" in shown


def test_the_count_column_says_done_of_total_rows_per_s_and_time_left():
    c = progress.Count("train", 480, exact=True, done=120, rows=30_720)
    assert count_text(c, 60.0) == "120/480 batches (train), 512 rows/s, 0:03:00 left"
    c.exact = False  # a training total before every chunk was split: said to be an estimate
    assert count_text(c, 60.0) == "120/~480 batches (train), 512 rows/s, ~0:03:00 left"
    r = progress.Count("single_stream", 1024, exact=False, unit="requests", done=24, rows=24)
    assert count_text(r, 2.0) == "24/>=1,024 requests (single_stream), 12 rows/s, ~0:01:23 left"
    assert count_text(None, 1.0) == ""
    assert count_text(progress.Count("predict", None), 1.0) == "0/? batches (predict)"
    shown = _Shown(count=c, began=10.0)
    assert str(_CountColumn(shown, now=lambda: 70.0).render(None)) == count_text(c, 60.0)  # type: ignore[arg-type]


def test_the_closing_report_puts_the_projection_beside_what_the_region_took():
    m = {K.RUN_PROJECTED_SECONDS: 95.25, K.RUN_PROJECTED_AT_SECONDS: 3.5, K.RUN_PROJECTED_EXACT: 1.0}
    m[K.HARNESS_REGION_SECONDS] = 90.0
    assert _projection_line(m) == "projection           95.2 s of timed region projected 3.5 s in; it took 90.0 s"
    m[K.RUN_PROJECTED_EXACT], m[K.RUN_REPROJECTED_SECONDS] = 0.0, 91.0
    assert _projection_line(m).endswith("3.5 s in (estimated counts), re-projected 91.0 s; it took 90.0 s")
