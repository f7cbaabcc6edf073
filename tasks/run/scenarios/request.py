"""One request through the serving path, each step timed with the run's clock:

    retrieve (by key) -> preprocess -> (encode) -> tensorize -> compute -> calibrate -> write

The workload's own chain (tasks/run/chain.py), run directly: a Prefect task per request
would add orchestration to every request's latency. Step times also add into the run's stage
table; held-out labels feed the calibration quality outside the timing. What a call counts
(figures, stage table, quality; ``report_mask`` hashes its keys) runs in ``settle``, which
the scenarios call outside every request's latency span, a call's worth at a time when asked
(the server settles a bounded amount per idle gap: tasks/run/scenarios/server.py).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable

import numpy as np

from tasks.run.chain import Prepared, run_directly
from tasks.run.scenarios.outputs import ServedOutputs
from tasks.run.scenarios.workload import Workload
from tasks.stages.engine import PredictOutputs
from tasks.stages.write import PredictionWriter


class RequestPath:
    def __init__(self, work: Workload, writer: PredictionWriter) -> None:
        self.work, self.writer, self.chain = work, writer, work.chain
        # A run without a checkpoint fits its encoding on the first chunk, untimed.
        self.chain.ready_engine(work.chunks[0])
        self.scored_keys: list[np.ndarray] = []  # each call's root keys (LatencyRecord.scored_keys)
        # run.request.check_outputs: each call's written predictions, by reference
        self.outputs = ServedOutputs() if work.spec.run.request.check_outputs else None
        # Bookkeeping of served calls (figures, stage table, quality), one list per call,
        # oldest first, run by ``settle``: the scenarios call it outside every request's
        # latency span, where it once ran.
        self._later: deque[list[Callable[[], None]]] = deque()

    def __call__(self, keys: np.ndarray) -> dict[str, float]:
        """Serve one request (or one batch of requests) for ``keys``; step -> seconds. Only the
        steps run here; what the call counts waits for ``settle``."""
        steps: dict[str, float] = {}
        rows: dict[str, int] = {}

        def record(stage: str, seconds: float, n: int) -> None:
            steps[stage], rows[stage] = seconds, n

        chain = self.chain
        p = chain.prepare(keys, record, runner=run_directly)
        later: list[Callable[[], None]] = []
        outs = chain.serve(p.tz, self.writer, record, runner=run_directly, later=later)
        later.append(functools.partial(self._book, keys, p, outs, steps, rows))
        self._later.append(later)
        return steps

    @property
    def pending(self) -> int:
        """Served calls whose bookkeeping has not run yet."""
        return len(self._later)

    def settle(self, calls: int | None = None) -> int:
        """The bookkeeping of the ``calls`` oldest served calls (None: every one), in the order
        they were served; returns how many calls' bookkeeping is still pending."""
        for _ in range(len(self._later) if calls is None else min(calls, len(self._later))):
            for book in self._later.popleft():
                book()
        return len(self._later)

    def _book(
        self, keys: np.ndarray, p: Prepared, outs: PredictOutputs, steps: dict[str, float], rows: dict[str, int]
    ) -> None:
        work = self.work
        if self.outputs is not None:
            self.outputs.keep(p.tz.keys, outs)
        work.account(p, None)
        work.add_bytes(p, "predict")
        self.scored_keys.append(keys)
        stage_table = work.stages["predict"]
        for name, sec in steps.items():
            stage_table[name].add(sec, rows[name])
