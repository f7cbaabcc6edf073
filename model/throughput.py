"""Throughput callback: rows per second, estimated the way the model's documentation defines it.

- The *estimate* is completed batches x configured batch size / seconds. It over-counts a
  partial (last) batch, so it is only comparable between runs with the same batch geometry;
  exact row counts are the harness's job (``compute.steady_rows_per_s`` beside it).
- Accumulating is cheap (``on_batch_end``, fed only the batches the caller counts, e.g. the
  steady-state ones). Reporting happens in ``flush``, outside timed regions: the figure is
  retained as ``callback.metrics`` and sent directly to the attached logger (any object with
  ``log(metrics, step)``), not through a trainer's metrics.
"""

from __future__ import annotations

from typing import Protocol


class Logger(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...


class ThroughputCallback:
    def __init__(self, batch_size: int, key: str, logger: Logger | None = None) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size={batch_size} must be a positive integer")
        self.batch_size = batch_size
        self.key = key  # the metric name the estimate is logged under
        self.logger = logger
        self.metrics: dict[str, float] = {}
        self.batches = 0
        self.seconds = 0.0

    def on_batch_end(self, seconds: float) -> None:
        self.batches += 1
        self.seconds += float(seconds)

    @property
    def estimated_rows_per_s(self) -> float:
        return self.batches * self.batch_size / self.seconds if self.seconds > 0 else 0.0

    def flush(self, step: int = 0) -> dict[str, float]:
        """Retain the estimate and send it to the attached logger (if any)."""
        self.metrics = {self.key: self.estimated_rows_per_s}
        if self.logger is not None:
            self.logger.log(self.metrics, step)
        return self.metrics
