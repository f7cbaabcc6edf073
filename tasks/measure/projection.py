"""The run's projected duration: what is left, priced at what the run has measured so far.

A projection is made once a phase has run its first steady batches (after the first call and
``run.warmup_batches``: compilation and cold caches never price the rest). It projects the
**timed region** (``harness.region_seconds``): the seconds spent so far, plus for every phase
still to run

- ``compute``: its batches left x the mean seconds of a steady batch (the phase's own; a
  predict phase not yet run is priced at training's steady batch, a forward and backward where
  predict runs a forward only, so an over-estimate until its own batches re-price it);
- ``stages``: the root rows its other stages (retrieve, preprocess, encode, tensorize, and for
  predict calibrate and write) still have to take x their seconds per root row so far in that
  phase (a predict phase not yet run: training's retrieve..tensorize per row, no write yet);
- a request run (single_stream, server): the seconds its schedule still needs at least
  (``run.request.min_duration_s``, the server's last arrival) until its own requests price it
  (the requests left at their mean latency, or the duration left, whichever is longer).

Not priced: the calibration fit and the serving backend's set-up between training and predict
(an ONNX export), Prefect's per-step call overhead (``harness.orchestration_seconds``), and
anything outside the region (start-up, the output checks, logging). ``exact`` is False when a
count it used is an estimate (a training epoch's batches before every chunk was split).

Pure arithmetic on typed inputs: ``tests/tasks/measure/test_projection.py`` checks it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from tasks.measure import keys as K


@dataclass(frozen=True)
class PhaseLeft:
    """One phase's work left and the measured costs it is priced at."""

    phase: str  # train | predict | single_stream | server
    batches_left: int = 0
    seconds_per_batch: float = 0.0  # steady compute seconds of one batch
    rows_left: int = 0  # root rows still to go through the phase's other stages
    seconds_per_row: float = 0.0  # those stages' seconds per root row
    schedule_seconds: float = 0.0  # a request run: seconds its schedule still needs
    exact: bool = True  # False: batches_left or rows_left is an estimate
    priced_by: str = ""  # whose measurements price it, for the message

    @property
    def compute_seconds(self) -> float:
        return self.batches_left * self.seconds_per_batch

    @property
    def stage_seconds(self) -> float:
        return self.rows_left * self.seconds_per_row

    @property
    def seconds(self) -> float:
        return self.compute_seconds + self.stage_seconds + self.schedule_seconds


@dataclass(frozen=True)
class Projection:
    """The timed region's projected seconds, made ``elapsed_seconds`` into it after ``at``'s
    first steady batches; ``phases`` are the phases still to run (the current one first)."""

    at: str  # the phase whose steady batches priced it
    elapsed_seconds: float
    phases: tuple[PhaseLeft, ...]

    @property
    def remaining_seconds(self) -> float:
        return sum(p.seconds for p in self.phases)

    @property
    def total_seconds(self) -> float:
        return self.elapsed_seconds + self.remaining_seconds

    @property
    def exact(self) -> bool:
        return all(p.exact for p in self.phases)

    def describe(self) -> str:
        """One line: the total, and what each phase left adds."""
        parts = []
        for p in self.phases:
            if p.schedule_seconds:
                parts.append(f"{p.phase} {p.seconds:,.1f} s ({p.priced_by})")
                continue
            est = "" if p.exact else "~"
            parts.append(
                f"{p.phase} {p.seconds:,.1f} s ({est}{p.batches_left:,} batches x {p.seconds_per_batch * 1e3:,.1f} ms"
                f" + {est}{p.rows_left:,} rows x {p.seconds_per_row * 1e6:,.1f} us in the other stages;"
                f" {p.priced_by})"
            )
        return (
            f"projected {self.total_seconds:,.1f} s of timed region ({self.total_seconds / 60:,.1f} min): "
            f"{self.elapsed_seconds:,.1f} s so far + " + " + ".join(parts)
        )


@dataclass
class Projections:
    """The run's projections: the first (after its first steady batches) decides
    ``run.max_minutes``; later ones re-price the phases that had not run yet."""

    made: list[Projection]

    def metrics(self) -> dict[str, float]:
        if not self.made:
            return {}
        first, last = self.made[0], self.made[-1]
        m = {
            K.RUN_PROJECTED_SECONDS: first.total_seconds,
            K.RUN_PROJECTED_AT_SECONDS: first.elapsed_seconds,
            K.RUN_PROJECTED_EXACT: float(first.exact),
        }
        if len(self.made) > 1:
            m[K.RUN_REPROJECTED_SECONDS] = last.total_seconds
        return m
