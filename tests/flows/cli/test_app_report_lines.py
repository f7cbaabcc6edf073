"""Lines of the run's closing report that are built from its metrics alone.

Named ``test_app_report_lines.py`` (tests/README.md): test_app.py holds the app's own tests; this
file is one aspect (the closing report's lines, flows/cli/app.py)."""

from __future__ import annotations

from flows.cli.app import _first_call_line
from tasks.measure import keys as K

BASE = {K.FIRST_CALL_SECONDS: 2.8672, K.compute("predict", "batch_ms.p50"): 39.1}


def test_a_cold_first_call_says_nothing_of_the_cache():
    assert _first_call_line({**BASE, K.COMPILE_CACHE_HITS: 0.0, K.COMPILE_CACHE_MISSES: 8.0}) == (
        "compute first call   2,867.2 ms (steady batch p50 39.1 ms)"
    )
    assert "cache" not in _first_call_line(BASE)  # an older run's record, without the figure


def test_a_first_call_served_from_the_compiler_cache_says_so():
    line = _first_call_line({**BASE, K.COMPILE_CACHE_HITS: 8.0, K.COMPILE_CACHE_MISSES: 0.0})
    assert line.endswith("(steady batch p50 39.1 ms; 8 compiled graphs from the compiler's cache: not a cold compile)")
