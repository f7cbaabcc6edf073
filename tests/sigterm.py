"""A SIGTERM ends a test session the way Ctrl-C does.

The servers the fixtures start (PostgreSQL, MLflow, Prefect) run in sessions of their own, so
a signal to pytest does not reach them; pytest's default SIGTERM death skips every fixture's
``finally`` and leaves them running (a CI timeout, a ``kill`` of a stuck run: seen here, a
Prefect server still up 18 minutes after its session was killed). As a KeyboardInterrupt,
pytest stops the test in progress and runs the teardowns, which stop the servers.
"""

from __future__ import annotations

import signal
from types import FrameType


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def stop_on_sigterm() -> None:
    """Install the handler (main thread only, as ``signal.signal`` requires)."""
    signal.signal(signal.SIGTERM, _interrupt)
