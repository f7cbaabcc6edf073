"""The run's closing latency line (flows/cli/app.py): every step that had a share is shown,
encode only where a library owns it (relational_transformers), never invented elsewhere.

Named ``test_app_latency_line.py`` (tests/README.md): test_app.py holds the app's own tests; this
file is one aspect (the closing latency line, flows/cli/app.py)."""

from __future__ import annotations

from flows.cli.app import _latency_line
from tasks.measure import keys as K


def _metrics(shares: dict[str, float]) -> dict[str, float]:
    m = {K.LATENCY_REQUESTS: 8.0, K.LATENCY_DURATION_SECONDS: 4.2}
    return m | {K.latency_step_share(s): v for s, v in shares.items()}


def test_an_encode_step_is_shown_with_its_share():
    line = _latency_line(_metrics({"retrieve": 0.25, "encode": 0.085, "compute": 0.5}))
    assert "retrieve 25%, preprocess 0%, encode 8%, tensorize 0%, compute 50%" in line


def test_no_encode_step_where_the_run_had_none():
    line = _latency_line(_metrics({"retrieve": 0.25, "compute": 0.5}))
    assert "encode" not in line and "retrieve 25%, preprocess 0%, tensorize 0%, compute 50%" in line
