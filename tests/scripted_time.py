"""A clock that moves only when a test says so: ``t`` is its time, and the harness's own
waits (``Clock.sleep``: the server waiting for an arrival) advance it instead of sleeping.
The region, serving-threads and trace tests build on it."""

from __future__ import annotations

from tasks.measure.clock import Clock


class ScriptedTime:
    def __init__(self) -> None:
        self.t = 0.0
        self.clock = Clock(None, now=lambda: self.t, sleep=self.sleep)

    def sleep(self, seconds: float) -> None:
        self.t += seconds
