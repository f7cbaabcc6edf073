"""Typed measurement records, turned into metric keys here (names from ``tasks/measure/keys.py``).

Stages add into one ``StageTiming`` per (phase, stage) of a ``StageTable``; the region returns
it frozen (``StageReport``): training epochs and predict passes are different work and are
never summed under one rows/s. The compute stage fills ``PhaseTimings`` per phase. A scenario
returns its own report (``OfflineReport``: the offline passes), which the record holds.
``RunResult.metrics()`` is the public MLflow contract: every key carries its unit and is
catalogued in ``tasks/measure/keys.py``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import numpy as np

from tasks.measure import keys as K
from tasks.measure.gcpauses import GcPauses
from tasks.measure.keys import PHASE_STAGES, PHASES, STAGES
from tasks.measure.memory import MemoryPeaks
from tasks.measure.noise import cv
from tasks.measure.projection import Projections
from tasks.measure.stats import MIN_CI_SAMPLES, median_interval, nearest_rank

__all__ = [
    "PHASES",
    "STAGES",
    "BatchCoordinates",
    "CalibrationFit",
    "CompileCounters",
    "CompilerCache",
    "DataReport",
    "DataTally",
    "EncodeCounts",
    "EncodeUnit",
    "EngineReport",
    "FlowSeconds",
    "HarnessFigures",
    "ModelReport",
    "OfflineReport",
    "OutputReport",
    "PassFigures",
    "PhaseTimings",
    "Region",
    "RegionReport",
    "RunResult",
    "StagePass",
    "StageFigures",
    "StageReport",
    "StageTable",
    "StageTiming",
    "TrainingReport",
    "WarmStage",
    "describe_repeats",
]


@dataclass
class StageTiming:
    name: str
    phase: str = "predict"
    seconds: float = 0.0
    rows: int = 0  # root rows through the stage (summed over chunks and passes)
    calls: int = 0  # chunks through the stage (``RunResult.ran`` reads it)
    bytes: int = 0  # bytes the stage handled, where the chain counts them (floor ledger)

    def add(self, seconds: float, rows: int) -> None:
        self.seconds += seconds
        self.rows += rows
        self.calls += 1

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


class StageTable:
    """The per-(phase, stage) table the stages add into while the region runs (the workload's:
    its ``sink``); ``report`` is what the region returns. ``encode``: the chain has a text
    encoder, an extra step before tensorize."""

    def __init__(self, encode: bool = False) -> None:
        self.phases: dict[str, dict[str, StageTiming]] = {}
        for ph in PHASES:
            names = list(PHASE_STAGES[ph])
            if encode:
                names.insert(names.index("tensorize"), "encode")
            self.phases[ph] = {s: StageTiming(s, ph) for s in names}

    def __getitem__(self, phase: str) -> dict[str, StageTiming]:
        return self.phases[phase]

    def seconds(self, phase: str) -> float:
        """``phase``'s stage seconds (its end to end)."""
        return sum(s.seconds for s in self.phases[phase].values())

    @property
    def timed_seconds(self) -> float:
        """Seconds in the stages over both phases (the region's ``stage`` bucket)."""
        return sum(self.seconds(ph) for ph in PHASES)

    def report(self) -> StageReport:
        def frozen(ph: str) -> tuple[StageFigures, ...]:
            return tuple(
                StageFigures(s.name, ph, s.seconds, s.rows, s.calls, s.bytes) for s in self.phases[ph].values()
            )

        return StageReport(train=frozen("train"), predict=frozen("predict"))


@dataclass(frozen=True)
class StageFigures:
    """One (phase, stage) of the stage table as the region left it."""

    name: str
    phase: str
    seconds: float = 0.0
    rows: int = 0  # root rows through the stage (summed over chunks and passes)
    calls: int = 0  # chunks (or served calls) through the stage
    bytes: int = 0  # bytes the stage handled, where the chain counts them (floor ledger)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class StageReport:
    """The stage table (``StageTable.report``): each phase's stages in the chain's order.
    Training epochs and predict passes are different work, never summed under one rows/s."""

    train: tuple[StageFigures, ...] = ()
    predict: tuple[StageFigures, ...] = ()

    def phase(self, phase: str) -> tuple[StageFigures, ...]:
        return self.train if phase == "train" else self.predict

    def stage(self, phase: str, name: str) -> StageFigures:
        return next((s for s in self.phase(phase) if s.name == name), StageFigures(name, phase))

    def seconds(self, phase: str) -> float:
        """``phase``'s stage seconds (its end to end)."""
        return sum(s.seconds for s in self.phase(phase))

    @property
    def timed_seconds(self) -> float:
        return sum(self.seconds(ph) for ph in PHASES)

    def ran(self, phase: str) -> bool:
        return any(s.calls for s in self.phase(phase))

    def with_bytes(self, phase: str, name: str, n: int) -> StageReport:
        """The same table with ``n`` bytes for one stage (the write stage's, once the prediction
        file is committed)."""
        stages = tuple(replace(s, bytes=n) if s.name == name else s for s in self.phase(phase))
        return replace(self, **{phase: stages})

    def metrics(self) -> dict[str, float]:
        """``stage.<stage>.<phase>.*`` of each phase that ran."""
        m: dict[str, float] = {}
        for phase in PHASES:
            if not self.ran(phase):
                continue
            for s in self.phase(phase):
                m[K.stage_seconds(s.name, phase)] = s.seconds
                m[K.stage_rows(s.name, phase)] = float(s.rows)
                m[K.stage_rows_per_s(s.name, phase)] = s.rows_per_s
                if s.bytes:
                    m[K.stage_bytes(s.name, phase)] = float(s.bytes)
        return m

    def table(self) -> list[dict[str, float | str]]:
        """One row per (phase, stage) that ran; ``share`` is of that phase's end-to-end."""
        rows: list[dict[str, float | str]] = []
        for phase in PHASES:
            if not self.ran(phase):
                continue
            total = self.seconds(phase) or 1.0
            rows += [
                {
                    "phase": phase,
                    "stage": s.name,
                    "seconds": s.seconds,
                    "rows": s.rows,
                    "rows_per_s": s.rows_per_s,
                    "share": s.seconds / total,
                }
                for s in self.phase(phase)
            ]
        return rows


@dataclass
class PhaseTimings:
    """Per-batch times of one compute phase, split into first call, warm-up and steady."""

    warmup_batches: int
    first_call_seconds: float | None = None
    warmup_seconds: list[float] = field(default_factory=list)
    steady_seconds: list[float] = field(default_factory=list)
    steady_rows: list[int] = field(default_factory=list)
    input_seconds: float = 0.0  # slicing + host->device copies, i.e. waiting for input
    updates: int = 0

    def record(self, seconds: float, rows: int) -> None:
        if self.first_call_seconds is None:
            self.first_call_seconds = seconds
        elif len(self.warmup_seconds) < self.warmup_batches:
            self.warmup_seconds.append(seconds)
        else:
            self.steady_seconds.append(seconds)
            self.steady_rows.append(rows)

    @property
    def in_steady_state(self) -> bool:
        """The next batch counts as steady (first call and warm-up are done)."""
        return self.first_call_seconds is not None and len(self.warmup_seconds) >= self.warmup_batches

    @property
    def steady_rows_per_s(self) -> float:
        t = sum(self.steady_seconds)
        return sum(self.steady_rows) / t if t > 0 else 0.0

    def percentile_ms(self, q: float) -> float:
        """Nearest-rank percentile of the steady batch times, in ms (as request latencies)."""
        if not self.steady_seconds:
            return 0.0
        return nearest_rank(self.steady_seconds, q) * 1e3

    @property
    def steady_batch_cv(self) -> float | None:
        """CV of the steady window's batch times (its own noise floor), over its full-size
        batches: a chunk's last, smaller batch is faster by its size, not by noise. None
        below two such batches."""
        if not self.steady_rows:
            return None
        full = max(self.steady_rows)
        spread = cv([s for s, r in zip(self.steady_seconds, self.steady_rows, strict=True) if r == full])
        return spread if math.isfinite(spread) else None

    def metrics(self, key: Callable[[str], str]) -> dict[str, float]:
        """Figures under ``key(what)`` (``keys.compute`` or ``keys.compute_phase`` of a phase)."""
        out = {
            key("first_call_seconds"): self.first_call_seconds or 0.0,
            key("steady_rows_per_s"): self.steady_rows_per_s,
            key("steady_batches"): float(len(self.steady_seconds)),
            key("steady_seconds"): float(sum(self.steady_seconds)),
            key("batch_ms.p50"): self.percentile_ms(50),
            key("batch_ms.p95"): self.percentile_ms(95),
            key("batch_ms.p99"): self.percentile_ms(99),
        }
        if (spread := self.steady_batch_cv) is not None:
            out[key("steady_batch_ms.cv")] = spread
        if self.steady_seconds and self.first_call_seconds is not None:
            out[key("compile_overhead_seconds")] = self.first_call_seconds - statistics.median(self.steady_seconds)
        return out


class Figures(Protocol):
    """A record that keys its own figures (tasks/run/record/collect.py ``Region``,
    tasks/run/scenarios/latency.py ``LatencyRecord``, tasks/run/scenarios/outputs.py ``OutputCheck``):
    those modules build on this one, so it names what it calls, not their types."""

    def metrics(self) -> dict[str, float]: ...


@dataclass(frozen=True)
class StagePass:
    """One predict stage's table across one pass: its seconds and bytes before and after."""

    seconds_before: float
    bytes_before: int
    seconds_after: float
    bytes_after: int


@dataclass(frozen=True)
class WarmStage:
    """One predict stage over the passes after the first (pass 0 holds the first calls,
    compilation and cold caches; the floor ledger's stages are warm)."""

    seconds: float = 0.0
    bytes: int | None = None  # None: no warm pass moved bytes through the stage (no figure)

    def plus(self, stage: StagePass) -> WarmStage:
        """With what ``stage`` added in one more warm pass."""
        seconds = self.seconds + stage.seconds_after - stage.seconds_before  # (sum + now) - before: no reassociation
        moved = stage.bytes_after > stage.bytes_before
        return WarmStage(seconds, (self.bytes or 0) + stage.bytes_after - stage.bytes_before if moved else self.bytes)


@dataclass(frozen=True)
class PassFigures:
    """One offline predict pass (tasks/run/scenarios/offline.py ``predict_pass``)."""

    rows: int  # root rows predicted
    rows_per_s: float  # end to end: rows over the pass's predict stage seconds
    steady_rows_per_s: float | None  # its steady compute batches' (None: it had none)
    stages: dict[str, StagePass]  # predict stage -> its table across the pass


@dataclass(frozen=True)
class OfflineReport:
    """The offline scenario's passes (``run.repeats``), folded (``of``): what the record keys
    from them besides the stage table. Pass 0 carries the first call (compilation, cold
    caches): the repeat statistics and the warm stages start at pass 1."""

    rows_predicted: int = 0  # summed over the passes
    passes: int = 0
    rows_per_s: tuple[float, ...] = ()  # end to end, one per pass
    steady_rows_per_s: tuple[float, ...] = ()  # steady compute, one per pass that had steady batches
    warm_stages: dict[str, WarmStage] = field(default_factory=dict)  # predict stage -> warm passes

    @classmethod
    def of(cls, passes: list[PassFigures]) -> OfflineReport:
        warm: dict[str, WarmStage] = {}
        for p in passes[1:]:
            for name, stage in p.stages.items():
                warm[name] = warm.get(name, WarmStage()).plus(stage)
        return cls(
            rows_predicted=sum(p.rows for p in passes),
            passes=len(passes),
            rows_per_s=tuple(p.rows_per_s for p in passes),
            steady_rows_per_s=tuple(p.steady_rows_per_s for p in passes if p.steady_rows_per_s is not None),
            warm_stages=warm,
        )

    def repeat_metrics(self) -> dict[str, float]:
        """The medians over passes 1.. and, where the sample supports it, their intervals."""
        m: dict[str, float] = {}
        for key, passes in ((K.E2E_PREDICT_ROWS_PER_S, self.rows_per_s), (K.STEADY_ROWS_PER_S, self.steady_rows_per_s)):
            samples = list(passes[1:])
            if len(samples) < 2:
                continue
            iv = median_interval(samples)
            m[K.median(key)] = iv.median
            if iv.low is not None and iv.high is not None and iv.level is not None:
                m[K.median_ci_low(key)] = iv.low
                m[K.median_ci_high(key)] = iv.high
                m[K.median_ci_level(key)] = iv.level
        m[K.REPEATS_MEASURED] = float(max(len(self.rows_per_s) - 1, 0))
        return m

    def warm_metrics(self) -> dict[str, float]:
        """``stage.<stage>.predict.warm_seconds`` and ``warm_bytes`` (a stage that moved bytes)."""
        m: dict[str, float] = {}
        for name, warm in self.warm_stages.items():
            m[K.stage_warm_seconds(name)] = warm.seconds
            if warm.bytes is not None:
                m[K.stage_warm_bytes(name)] = float(warm.bytes)
        return m


NO_PASSES = OfflineReport()  # a request scenario's: no offline pass ran


@dataclass(frozen=True)
class CalibrationFit:
    """The temperature fit after training (tasks/run/scenarios/workload.py ``fit_calibration``;
    the temperature the run served with is the engine report's)."""

    seconds: float
    rows: int
    errors: int | None  # fit rows with a wrong top class; 0: no finite T, T = 1 kept (None: no fit rows)

    def metrics(self) -> dict[str, float]:
        m = {K.CALIBRATION_FIT_SECONDS: self.seconds, K.CALIBRATION_FIT_ROWS: float(self.rows)}
        if self.errors is not None:
            m[K.CALIBRATION_FIT_ERRORS] = float(self.errors)
        return m


@dataclass(frozen=True)
class TrainingReport:
    """The training phase besides its stage table and compute timings: the epochs run and the
    optimizer updates in the first (tasks/run/scenarios/workload.py ``Workload.train``; a DDP
    job's, tasks/run/distributed/launch.py ``train``)."""

    epochs: int = 0
    updates_per_epoch: int = 0
    ranks_mean_seconds: float | None = None  # run.distributed: the ranks' mean train stage seconds


NO_TRAINING = TrainingReport()  # a predict run's: no epoch ran


@dataclass(frozen=True)
class OutputReport:
    """The files the run keeps, committed after the region (tasks/run/record/assemble.py): the
    prediction file (its rows and bytes) and the checkpoint of the weights it trained."""

    rows: int = 0  # rows written
    bytes: int = 0
    path: str = ""
    checkpoint: str | None = None  # train+predict runs

    def metrics(self) -> dict[str, float]:
        return {
            K.OUTPUT_BYTES: float(self.bytes),
            K.DATA_ROWS_WRITTEN: float(self.rows),
            K.OUTPUT_BYTES_PER_ROW: self.bytes / self.rows if self.rows else 0.0,
        }


@dataclass(frozen=True)
class CompileCounters:
    """Dynamo frames compiled and compile-cache hits/misses during the run (this process)."""

    frames: int
    cache_hits: int
    cache_misses: int

    def metrics(self) -> dict[str, float]:
        return {
            K.COMPILED_FRAMES: float(self.frames),
            K.COMPILE_CACHE_HITS: float(self.cache_hits),
            K.COMPILE_CACHE_MISSES: float(self.cache_misses),
        }


EncodeUnit = Literal["cells", "strings"]
"""What an encode step's count counts: ``cells``, the reference model's text encoder (one
vector per text cell, nulls included); ``strings``, relational-transformers' (each distinct
string and column name of a chunk once, gathered into its cells later)."""

# Each unit's keys: one meaning per key, so a count of strings never lands under a cells key.
ENCODE_KEYS: dict[EncodeUnit, tuple[str, str]] = {
    "cells": (K.DATA_TEXT_CELLS, K.ENCODE_CELLS_PER_S),
    "strings": (K.DATA_STRINGS_ENCODED, K.ENCODE_STRINGS_PER_S),
}


@dataclass(frozen=True)
class EncodeCounts:
    """The application's encode step: what it turned into vectors per predict pass and its
    throughput, under the keys of the unit it counts (``ENCODE_KEYS``)."""

    per_pass: int
    per_s: float
    unit: EncodeUnit = "cells"

    def metrics(self) -> dict[str, float]:
        per_pass, per_s = ENCODE_KEYS[self.unit]
        return {per_pass: float(self.per_pass), per_s: self.per_s}


@dataclass
class DataTally:
    """What the workload read and laid out while the region runs (tasks/run/scenarios/workload.py
    ``Workload.account``: data figures once per chunk, every time for a request); ``report`` is
    what the region returns."""

    root_rows: int = 0  # distinct root rows of the workload
    chunks: int = 0
    bytes_read: int = 0
    rows_read: int | None = None  # source rows, every table (None: nothing prepared)
    coords_present: int = 0
    coords_reserved: int | None = 0  # None: a model with no reserved layout (relational-transformers)
    overflow_dropped: dict[str, int] = field(default_factory=dict)  # branch -> rows over max_length
    rows_served: int = 0  # a request scenario's root rows, the cold request included
    encoded: int = 0  # what the encode step turned into vectors, every call (its rate)
    encoded_per_pass: int = 0  # ... once per chunk
    encode_unit: EncodeUnit | None = None  # from the first prepared chunk or request

    def report(self, encode_seconds: float | None) -> DataReport:
        """Frozen; ``encode_seconds``: every encode call's seconds (None: no encode step)."""
        encode = None
        if encode_seconds is not None:
            rate = self.encoded / encode_seconds if encode_seconds > 0 else 0.0
            encode = EncodeCounts(self.encoded_per_pass, rate, self.encode_unit or "cells")
        return DataReport(
            root_rows=self.root_rows,
            chunks=self.chunks,
            bytes_read=self.bytes_read,
            rows_read=self.rows_read,
            coords_present=self.coords_present,
            coords_reserved=self.coords_reserved,
            overflow_dropped=dict(self.overflow_dropped),
            rows_served=self.rows_served,
            encode=encode,
        )


@dataclass(frozen=True)
class DataReport:
    """What the run's workload read and laid out (``DataTally.report``): ``data.*`` keys and the
    encode step's counts."""

    root_rows: int = 0
    chunks: int = 0
    bytes_read: int = 0
    rows_read: int | None = None  # None: no figure
    coords_present: int = 0
    coords_reserved: int | None = 0  # None: no reserved layout, no coords_reserved or occupancy
    overflow_dropped: dict[str, int] = field(default_factory=dict)  # branch -> rows dropped
    rows_served: int = 0  # a request scenario's root rows (RunResult.rows_predicted)
    encode: EncodeCounts | None = None  # runs with an encode step

    def layout_metrics(self) -> dict[str, float]:
        """Bytes read, the coordinates' layout, what overflowed and the chunks."""
        m = {K.DATA_BYTES_READ: float(self.bytes_read), K.DATA_COORDS_PRESENT: float(self.coords_present)}
        if self.coords_reserved is not None:  # a model without a reserved layout has neither figure
            m[K.DATA_COORDS_RESERVED] = float(self.coords_reserved)
            m[K.DATA_OCCUPANCY] = self.coords_present / self.coords_reserved if self.coords_reserved else 0.0
        m[K.DATA_OVERFLOW_DROPPED] = float(sum(self.overflow_dropped.values()))
        for name, n in self.overflow_dropped.items():
            m[K.overflow_dropped(name)] = float(n)
        m[K.DATA_CHUNKS] = float(self.chunks)
        return m


CompilerCache = Literal["cold", "warm", "mixed", "none"]
"""Where a run's compiled graphs came from: ``cold`` (every one built here), ``warm`` (every one
from the on-disk cache), ``mixed``, or ``none`` (nothing compiled); tag ``relflow.compiler_cache``."""


@dataclass(frozen=True)
class BatchCoordinates:
    """What the predict batches really held (issue 13): the coordinates materialised per predict
    pass or served request (each batch at the shape it was padded to, not the schema product
    unless bucketing is off), the present share per batch, the distinct padded shapes seen."""

    padded_coords: float  # per predict pass (or served request)
    occupancy_p50: float
    occupancy_min: float
    shapes: int

    @classmethod
    def of(cls, batch_coords: list[tuple[int, int]], passes: int, shapes: int) -> BatchCoordinates | None:
        """From each predict batch's (present, padded) coordinates; None without a batch."""
        if not batch_coords:
            return None
        present = np.array([p for p, _ in batch_coords], dtype=np.float64)
        padded = np.array([q for _, q in batch_coords], dtype=np.float64)
        occupancy = present / np.maximum(padded, 1.0)
        return cls(float(padded.sum()) / max(passes, 1), float(np.median(occupancy)), float(occupancy.min()), shapes)

    def metrics(self) -> dict[str, float]:
        return {
            K.DATA_PADDED_COORDS: self.padded_coords,
            K.DATA_BATCH_OCCUPANCY_P50: self.occupancy_p50,
            K.DATA_BATCH_OCCUPANCY_MIN: self.occupancy_min,
            K.DATA_BATCH_SHAPES: float(self.shapes),
        }


@dataclass(frozen=True)
class EngineReport:
    """What the model under test's engine recorded over the run, read once after the timed
    region (tasks/run/record/collect.py ``engine_figures``): each compute phase's batch times,
    compilation, the predict batches' coordinates, quality and the temperature it served with."""

    predict: PhaseTimings
    train: PhaseTimings | None  # train+predict runs
    compute_seconds: float  # wall time inside the compute stage (input wait's share is of it)
    worker_startup_seconds: float  # DataLoader worker start-up, not input wait
    recompiles: dict[str, int]  # phase -> in its steady window
    graph_breaks: dict[str, int]  # phase -> after its warm-up
    compile: CompileCounters
    compiler_cache: CompilerCache
    batch_coordinates: BatchCoordinates | None  # None: no predict batch
    quality: dict[str, float]  # the task's figures by name (accuracy, mae, ...; their intervals)
    temperature: float | None = None  # the calibration temperature served with
    calibration_report_rows: int | None = None  # held-out rows it was not fitted on (calibrated kinds)
    fp8_fallback_calls: int | None = None  # reference weights served natively in fp8
    backend_tags: dict[str, str] = field(default_factory=dict)  # what served the predict steps (tags)

    def compile_metrics(self) -> dict[str, float]:
        """Recompiles and graph breaks per phase (predict's under both key forms), in one order
        on every run: a set of the two forms logged them in the order of the process's string
        hashes, so two runs of one spec listed them differently."""
        m: dict[str, float] = {}
        for phase, n in self.recompiles.items():
            for key in dict.fromkeys((K.compute(phase, "recompiles"), K.compute_phase(phase, "recompiles"))):
                m[key] = float(n)
            for key in dict.fromkeys((K.compute(phase, "graph_breaks"), K.compute_phase(phase, "graph_breaks"))):
                m[key] = float(self.graph_breaks.get(phase, 0))
        return m

    @property
    def input_wait_fraction(self) -> float:
        input_s = sum(p.input_seconds for p in (self.train, self.predict) if p is not None)
        return input_s / self.compute_seconds if self.compute_seconds else 0.0

    def calibration_metrics(self) -> dict[str, float]:
        m: dict[str, float] = {}
        if self.temperature is not None:
            m[K.CALIBRATION_TEMPERATURE] = self.temperature
        if self.calibration_report_rows is not None:
            m[K.CALIBRATION_REPORT_ROWS] = float(self.calibration_report_rows)
        return m


@dataclass(frozen=True)
class ModelReport:
    """The model's own figures and its utilisation, read after the checkpoint is saved
    (tasks/run/record/assemble.py): keyed by the library and the phases that ran, so by name."""

    figures: dict[str, float]  # ModelFacts.metrics: the library's own
    utilisation: dict[str, float]  # MFU per phase, the peak it is against, the predict threads


@dataclass(frozen=True)
class Region:
    """The host around the timed region, as the harness measured it (tasks/measure/hostload.py,
    host_env.py): lock wait, bounds and load. ``RegionReport`` is the region inside."""

    waited: float  # seconds waiting for the host lock
    start_unix: float
    end_unix: float
    load_start: float  # load average per core just before
    other_before: float  # other processes' share of the cores just before
    other_during: float  # ... during the region
    stolen: float  # hypervisor steal during the region

    def metrics(self) -> dict[str, float]:
        return {
            K.HARNESS_LOCK_WAIT_SECONDS: self.waited,
            # When this run held the host: lets anyone check that timed regions never overlap.
            K.HARNESS_REGION_START: self.start_unix,
            K.HARNESS_REGION_END: self.end_unix,
            # Other work on the host is the biggest source of bad numbers on small machines.
            K.HOST_LOAD_PER_CORE_START: self.load_start,
            K.HOST_OTHER_CPU_FRACTION_BEFORE: self.other_before,
            K.HOST_OTHER_CPU_FRACTION: self.other_during,
            K.HOST_STEAL_FRACTION: self.stolen,
        }


@dataclass(frozen=True)
class RegionReport:
    """The timed region (tasks/run/scenarios/region.py ``run_region``): its seconds by bucket,
    which add up to ``seconds`` exactly (orchestration is what is left, never clamped), and the
    collector's pauses inside it (tasks/measure/gcpauses.py: no bucket, they fall in whichever ran)."""

    seconds: float
    stage_seconds: float
    engine_setup_seconds: float
    calibration_fit_seconds: float = 0.0
    backend_setup_seconds: float = 0.0
    request_wait_seconds: float = 0.0
    request_settle_seconds: float = 0.0
    distributed_launch_seconds: float = 0.0
    gc: GcPauses = field(default_factory=GcPauses)

    @property
    def orchestration_seconds(self) -> float:
        named = (
            self.calibration_fit_seconds,
            self.backend_setup_seconds,
            self.request_wait_seconds,
            self.request_settle_seconds,
            self.distributed_launch_seconds,
        )
        return self.seconds - (self.stage_seconds + self.engine_setup_seconds + sum(named))

    def bucket_metrics(self) -> dict[str, float]:
        """``harness.region_seconds`` and its buckets."""
        return {
            K.HARNESS_REGION_SECONDS: self.seconds,
            K.HARNESS_STAGE_SECONDS: self.stage_seconds,
            K.HARNESS_ENGINE_SETUP_SECONDS: self.engine_setup_seconds,
            K.HARNESS_CALIBRATION_FIT_SECONDS: self.calibration_fit_seconds,
            K.HARNESS_BACKEND_SETUP_SECONDS: self.backend_setup_seconds,
            K.HARNESS_REQUEST_WAIT_SECONDS: self.request_wait_seconds,
            K.HARNESS_REQUEST_SETTLE_SECONDS: self.request_settle_seconds,
            K.HARNESS_DISTRIBUTED_LAUNCH_SECONDS: self.distributed_launch_seconds,
            K.HARNESS_ORCHESTRATION_SECONDS: self.orchestration_seconds,
        }

    def metrics(self) -> dict[str, float]:
        return {**self.bucket_metrics(), **self.gc.metrics()}


@dataclass(frozen=True)
class HarnessFigures:
    """What the harness measured around the work (tasks/run/record/assemble.py)."""

    data_seconds: float
    startup_seconds: float  # launch + MLflow start
    mlflow_startup_seconds: float
    timed: RegionReport  # the timed region by bucket, and the collector's pauses inside it
    region: Figures  # Region: lock wait, region bounds, host load

    def metrics(self) -> dict[str, float]:
        return {
            K.HARNESS_DATA_SECONDS: self.data_seconds,
            K.HARNESS_STARTUP_SECONDS: self.startup_seconds,
            K.HARNESS_MLFLOW_STARTUP_SECONDS: self.mlflow_startup_seconds,
            **self.timed.metrics(),
            **self.region.metrics(),
        }


@dataclass(frozen=True)
class FlowSeconds:
    """The flow's wall time up to its final logging, and the part outside the five stages."""

    seconds: float
    overhead_seconds: float

    def metrics(self) -> dict[str, float]:
        return {K.HARNESS_FLOW_SECONDS: self.seconds, K.HARNESS_FLOW_OVERHEAD_SECONDS: self.overhead_seconds}


@dataclass
class RunResult:
    stages: StageReport = field(default_factory=StageReport)  # the region's stage table (train has no write)
    data: DataReport = field(default_factory=DataReport)  # what the workload read and laid out
    training: TrainingReport | None = None  # train+predict runs
    engine: EngineReport | None = None  # what the engine recorded (tasks/run/record/collect.py)
    memory: MemoryPeaks = field(default_factory=MemoryPeaks)  # the flow's sampler, host and device
    output: OutputReport = field(default_factory=OutputReport)
    # The flow's other figures, in the order its steps record them; ``metrics()`` keys them.
    data_checks: dict[str, float] = field(default_factory=dict)  # tasks/run/checks/data.py counts (plan)
    calibration: CalibrationFit | None = None  # train+predict runs
    backend_setup: BackendSetup | None = None
    checkpoint_load: CheckpointLoad | None = None  # run.checkpoint
    reference_quality: dict[str, float] = field(default_factory=dict)  # tasks/run/reference_pass.py quality_delta
    offline: OfflineReport | None = None  # the offline scenario's passes (tasks/run/scenarios/offline.py)
    latency: Figures | None = None  # LatencyRecord: single_stream / server runs
    projection: Projections | None = None  # run.projected_seconds (tasks/measure/projection.py)
    output_check: Figures | None = None  # OutputCheck: run.check_outputs (offline)
    harness: HarnessFigures | None = None
    model: ModelReport | None = None  # the model's facts and MFU (tasks/run/record/assemble.py)
    flow_seconds: FlowSeconds | None = None

    @property
    def rows_predicted(self) -> int:
        """Root rows predicted: the offline passes' (summed), or the served requests'."""
        return self.offline.rows_predicted if self.offline is not None else self.data.rows_served

    def _stage_metrics(self, m: dict[str, float]) -> None:
        m.update(self.stages.metrics())
        if self.stages.ran("predict"):
            sec = self.stages.seconds("predict")
            m[K.E2E_PREDICT_SECONDS] = sec
            m[K.E2E_PREDICT_ROWS] = float(self.rows_predicted)
            m[K.E2E_PREDICT_ROWS_PER_S] = self.rows_predicted / sec if sec > 0 else 0.0
            m[K.E2E_PREDICT_PASSES] = float((self.offline or NO_PASSES).passes)
        if self.stages.ran("train"):
            sec = self.stages.seconds("train")
            rows = self.stages.stage("train", "compute").rows
            m[K.E2E_TRAIN_SECONDS] = sec
            m[K.E2E_TRAIN_ROWS] = float(rows)
            m[K.E2E_TRAIN_ROWS_PER_S] = rows / sec if sec > 0 else 0.0
            m[K.E2E_TRAIN_EPOCHS] = float((self.training or NO_TRAINING).epochs)

    def metrics(self) -> dict[str, float]:
        m: dict[str, float] = {}
        self._stage_metrics(m)
        m[K.DATA_ROOT_ROWS] = float(self.data.root_rows)
        m[K.DATA_ROWS_PREDICTED] = float(self.rows_predicted)
        m.update(self.data.layout_metrics())
        e = self.engine
        if e is not None:
            m.update(e.predict.metrics(lambda w: K.compute_phase("predict", w)))
            m.update(e.predict.metrics(lambda w: K.compute("predict", w)))
            if e.train is not None:
                m.update(e.train.metrics(lambda w: K.compute("train", w)))
                m[K.TRAIN_UPDATES] = float(e.train.updates)
                m[K.TRAIN_UPDATES_PER_EPOCH] = float((self.training or NO_TRAINING).updates_per_epoch)
            m.update(e.compile_metrics())
        m.update((self.offline or NO_PASSES).repeat_metrics())
        m[K.INPUT_WAIT_FRACTION] = e.input_wait_fraction if e is not None else 0.0
        m[K.WORKER_STARTUP_SECONDS] = e.worker_startup_seconds if e is not None else 0.0
        m.update(self.memory.metrics())
        m.update(self.output.metrics())
        for k, v in (e.quality if e is not None else {}).items():
            m[K.quality(k)] = v
        self._work_metrics(m)
        self._harness_metrics(m)
        return m

    def _work_metrics(self, m: dict[str, float]) -> None:
        """Data checks, rows read, calibration, warm stages and the engine's figures."""
        m.update(self.data_checks)
        if self.data.rows_read is not None:
            m[K.DATA_ROWS_READ] = float(self.data.rows_read)
        if self.calibration is not None:
            m.update(self.calibration.metrics())
        e = self.engine
        if e is not None:
            m.update(e.calibration_metrics())
        m.update((self.offline or NO_PASSES).warm_metrics())
        if self.training is not None and self.training.ranks_mean_seconds is not None:
            m[K.E2E_TRAIN_RANKS_MEAN_SECONDS] = self.training.ranks_mean_seconds
        if e is not None:
            m.update(e.compile.metrics())
            if e.batch_coordinates is not None:
                m.update(e.batch_coordinates.metrics())
        if self.data.encode is not None:
            m.update(self.data.encode.metrics())

    def _harness_metrics(self, m: dict[str, float]) -> None:
        """The backend's set-up, what the harness measured around the work, the model's facts."""
        if self.backend_setup is not None:
            m.update(self.backend_setup.metrics())
        if self.checkpoint_load is not None:
            m.update(self.checkpoint_load.metrics())
        if self.engine is not None and self.engine.fp8_fallback_calls is not None:
            m[K.BACKEND_FP8_FALLBACK_CALLS] = float(self.engine.fp8_fallback_calls)
        m.update(self.reference_quality)
        if self.latency is not None:
            m.update(self.latency.metrics())
        if self.projection is not None:
            m.update(self.projection.metrics())
        if self.output_check is not None:
            m.update(self.output_check.metrics())
        if self.harness is not None:
            m.update(self.harness.metrics())
        if self.model is not None:
            m.update(self.model.figures)
            m.update(self.model.utilisation)
        if self.flow_seconds is not None:
            m.update(self.flow_seconds.metrics())


def batch_coordinate_metrics(batch_coords: list[tuple[int, int]], passes: int, shapes: int) -> dict[str, float]:
    """``data.padded_coords``, ``data.batch_occupancy.*`` and ``data.batch_shapes`` of the
    predict batches (``BatchCoordinates``); none without a batch."""
    figures = BatchCoordinates.of(batch_coords, passes, shapes)
    return figures.metrics() if figures is not None else {}


def describe_repeats(m: dict[str, float], key: str, unit: str = "rows/s") -> str | None:
    """The median over passes and, only where the sample supports it, its 95% interval."""
    if K.median(key) not in m:
        return None
    n = int(m.get(K.REPEATS_MEASURED, 0))
    text = f"median {m[K.median(key)]:,.0f} {unit} over {n} passes after the first"
    if K.median_ci_low(key) in m:
        level = m[K.median_ci_level(key)]
        return (
            text + f", 95% CI [{m[K.median_ci_low(key)]:,.0f}, {m[K.median_ci_high(key)]:,.0f}]"
            f" (order statistics, exact level {level:.1%})"
        )
    return text + f" (no 95% CI: needs run.repeats >= {MIN_CI_SAMPLES + 1})"


@dataclass
class CheckpointLoad:
    """What loading ``run.checkpoint`` cost: int8/int4 files save disk and load time, and
    expand to full precision in memory (``model_bytes_after_load`` vs ``model_bytes_fp32``)."""

    path: str
    weights_format: str
    bytes: int
    load_seconds: float
    host_after_load_bytes: int
    model_bytes_after_load: int
    model_bytes_fp32: int
    source_sha256: str | None = None
    quantized: dict[str, Any] | None = None  # the stored payload (fp8 native use); never logged

    def metrics(self) -> dict[str, float]:
        return {
            K.CHECKPOINT_BYTES: float(self.bytes),
            K.CHECKPOINT_LOAD_SECONDS: self.load_seconds,
            K.HOST_AFTER_LOAD_BYTES: float(self.host_after_load_bytes),
            K.MODEL_BYTES_AFTER_LOAD: float(self.model_bytes_after_load),
            K.MODEL_BYTES_FP32: float(self.model_bytes_fp32),
        }


@dataclass
class BackendSetup:
    """The serving backend's set-up, outside every timed stage: export (when the run exports
    its own checkpoint), ONNX Runtime's int8 quantization, session creation."""

    export_seconds: float | None = None
    export_bytes: int | None = None
    quantize_seconds: float | None = None
    load_seconds: float = 0.0
    model_bytes: int = 0
    graph_breaks_warmup: dict[str, int] = field(default_factory=dict)  # phase -> breaks

    def metrics(self) -> dict[str, float]:
        m = {K.BACKEND_LOAD_SECONDS: self.load_seconds, K.BACKEND_MODEL_BYTES: float(self.model_bytes)}
        for phase, n in self.graph_breaks_warmup.items():
            m[K.compute(phase, K.GRAPH_BREAKS_WARMUP)] = float(n)
        if self.export_seconds is not None:
            m[K.EXPORT_SECONDS] = self.export_seconds
            m[K.EXPORT_BYTES] = float(self.export_bytes or 0)
        if self.quantize_seconds is not None:
            m[K.EXPORT_QUANTIZE_SECONDS] = self.quantize_seconds
        return m
