"""Throughput callback: rows per second, estimated the way the product note defines it.

Design choices:
- The *estimate* is completed batches x configured batch size / seconds -- exactly what the
  note describes; it over-counts partial (last) batches, so it is only comparable between
  runs with the same batch geometry. The callback also counts exact rows, so both are
  reported side by side.
- Accumulating is cheap (``on_batch_end``); reporting happens in ``flush``, outside timed
  regions, and sends the prediction throughput directly to the attached logger (any
  object with ``log(metrics, step)`` and ``close()``). The last metrics stay available as
  ``callback.metrics``.
"""

from __future__ import annotations

from typing import Protocol


class Logger(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class ThroughputCallback:
    def __init__(self, batch_size: int, logger: Logger | None = None, stage: str = "predict"):
        if batch_size <= 0:
            raise ValueError(f"batch_size={batch_size} must be a positive integer")
        self.batch_size = batch_size
        self.logger = logger
        self.stage = stage
        self.metrics: dict[str, float] = {}
        self.reset()

    def reset(self) -> None:
        self.batches = 0
        self.rows = 0
        self.seconds = 0.0

    def on_batch_end(self, batch_rows: int, seconds: float) -> None:
        self.batches += 1
        self.rows += int(batch_rows)
        self.seconds += float(seconds)

    @property
    def estimated_rows(self) -> int:
        return self.batches * self.batch_size

    def compute(self) -> dict[str, float]:
        seconds = self.seconds if self.seconds > 0 else float("nan")
        return {
            f"{self.stage}.batches": float(self.batches),
            f"{self.stage}.rows": float(self.rows),
            f"{self.stage}.seconds": self.seconds,
            f"{self.stage}.rows_per_s_estimated": self.estimated_rows / seconds,
            f"{self.stage}.rows_per_s": self.rows / seconds,
        }

    def flush(self, step: int = 0) -> dict[str, float]:
        """Compute, retain and send the metrics to the attached logger (if any)."""
        self.metrics = self.compute()
        if self.logger is not None:
            self.logger.log(self.metrics, step)
        return self.metrics
