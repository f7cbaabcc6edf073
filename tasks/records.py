"""Typed measurement records and the one place that turns them into metric keys.

Stages add into ``StageTiming``; the compute stage fills ``PhaseTimings`` per phase
(train, predict). ``RunResult.metrics()`` is the public MLflow contract (DESIGN.md s5):
every key carries its unit, and no other module spells a metric key.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field

import numpy as np

from tasks.stats import median_ci

STAGES = ("retrieve", "preprocess", "tensorize", "compute", "write")


@dataclass
class StageTiming:
    name: str
    seconds: float = 0.0
    rows: int = 0  # root rows through the stage (summed over chunks and passes)
    calls: int = 0

    def add(self, seconds: float, rows: int) -> None:
        self.seconds += seconds
        self.rows += rows
        self.calls += 1

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


@dataclass
class PhaseTimings:
    """Per-batch times of one compute phase, split into first call, warm-up and steady."""

    warmup_batches: int
    batch_size: int
    first_call_seconds: float | None = None
    first_call_rows: int = 0
    warmup_seconds: list[float] = field(default_factory=list)
    steady_seconds: list[float] = field(default_factory=list)
    steady_rows: list[int] = field(default_factory=list)
    input_seconds: float = 0.0  # slicing + host->device copies, i.e. waiting for input
    updates: int = 0

    def record(self, seconds: float, rows: int) -> None:
        if self.first_call_seconds is None:
            self.first_call_seconds, self.first_call_rows = seconds, rows
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
    def batches(self) -> int:
        return (self.first_call_seconds is not None) + len(self.warmup_seconds) + len(self.steady_seconds)

    @property
    def steady_rows_per_s(self) -> float:
        t = sum(self.steady_seconds)
        return sum(self.steady_rows) / t if t > 0 else 0.0

    @property
    def estimated_rows_per_s(self) -> float:
        """The seed note's callback estimate: completed batches x configured batch size."""
        t = sum(self.steady_seconds)
        return len(self.steady_seconds) * self.batch_size / t if t > 0 else 0.0

    def percentile_ms(self, q: float) -> float:
        if not self.steady_seconds:
            return 0.0
        return float(np.percentile(np.asarray(self.steady_seconds) * 1e3, q))

    def metrics(self, prefix: str) -> dict[str, float]:
        out = {
            f"{prefix}.first_call_seconds": self.first_call_seconds or 0.0,
            f"{prefix}.steady_rows_per_s": self.steady_rows_per_s,
            f"{prefix}.estimated_rows_per_s": self.estimated_rows_per_s,
            f"{prefix}.steady_batches": float(len(self.steady_seconds)),
            f"{prefix}.steady_seconds": float(sum(self.steady_seconds)),
            f"{prefix}.batch_ms.p50": self.percentile_ms(50),
            f"{prefix}.batch_ms.p95": self.percentile_ms(95),
            f"{prefix}.batch_ms.p99": self.percentile_ms(99),
        }
        if self.steady_seconds and self.first_call_seconds is not None:
            out[f"{prefix}.compile_overhead_seconds"] = (
                self.first_call_seconds - statistics.median(self.steady_seconds))
        return out


@dataclass
class RunResult:
    stages: dict[str, StageTiming] = field(default_factory=lambda: {s: StageTiming(s) for s in STAGES})
    root_rows: int = 0  # distinct root rows of the workload
    rows_predicted: int = 0  # summed over predict passes (run.repeats)
    rows_written: int = 0  # rows in the kept prediction file
    bytes_read: int = 0
    coords_present: int = 0
    coords_reserved: int = 0
    overflow_dropped: dict[str, int] = field(default_factory=dict)
    train: PhaseTimings | None = None
    predict: PhaseTimings | None = None
    compute_seconds: float = 0.0  # wall time inside the compute stage (for input wait share)
    quality: dict[str, float] = field(default_factory=dict)
    output_bytes: int = 0
    output_path: str = ""
    host_peak_bytes: int = 0
    device_peak_bytes: int = 0
    chunks: int = 0
    recompiles: dict[str, int] = field(default_factory=dict)  # phase -> after warm-up
    graph_breaks: dict[str, int] = field(default_factory=dict)
    repeat_steady_rows_per_s: list[float] = field(default_factory=list)
    repeat_e2e_rows_per_s: list[float] = field(default_factory=list)
    updates_per_epoch: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def e2e_seconds(self) -> float:
        return sum(s.seconds for s in self.stages.values())

    def metrics(self) -> dict[str, float]:
        m: dict[str, float] = {}
        for s in self.stages.values():
            m[f"stage.{s.name}.seconds"] = s.seconds
            m[f"stage.{s.name}.rows_per_s"] = s.rows_per_s
        e2e = self.e2e_seconds
        m["e2e.seconds"] = e2e
        m["e2e.rows_per_s"] = self.rows_predicted / e2e if e2e > 0 else 0.0
        m["data.root_rows"] = float(self.root_rows)
        m["data.rows_predicted"] = float(self.rows_predicted)
        m["data.bytes_read"] = float(self.bytes_read)
        m["data.coords_present"] = float(self.coords_present)
        m["data.coords_reserved"] = float(self.coords_reserved)
        m["data.occupancy"] = self.coords_present / self.coords_reserved if self.coords_reserved else 0.0
        m["data.overflow_dropped"] = float(sum(self.overflow_dropped.values()))
        for name, n in self.overflow_dropped.items():
            m[f"data.overflow_dropped.{name}"] = float(n)
        m["data.chunks"] = float(self.chunks)
        if self.predict is not None:
            m.update(self.predict.metrics("compute.predict"))
            # Plain compute.* keys are the predict figures (the serving cost).
            m.update({k.replace("compute.predict.", "compute.", 1): v
                      for k, v in self.predict.metrics("compute.predict").items()})
        if self.train is not None:
            m.update(self.train.metrics("compute.train"))
            m["compute.train.updates"] = float(self.train.updates)
            m["compute.train.updates_per_epoch"] = float(self.updates_per_epoch)
        for phase, n in self.recompiles.items():
            key = "compute" if phase == "predict" else f"compute.{phase}"
            m[f"{key}.recompiles"] = float(n)
            m[f"{key}.graph_breaks"] = float(self.graph_breaks.get(phase, 0))
        for key, samples in (("compute.steady_rows_per_s", self.repeat_steady_rows_per_s),
                             ("e2e.rows_per_s", self.repeat_e2e_rows_per_s)):
            if samples:
                med, lo, hi = median_ci(samples)
                m[f"{key}.median"], m[f"{key}.ci_low"], m[f"{key}.ci_high"] = med, lo, hi
        m["run.repeats_measured"] = float(len(self.repeat_e2e_rows_per_s))
        input_s = sum(p.input_seconds for p in (self.train, self.predict) if p is not None)
        m["device.input_wait_fraction"] = input_s / self.compute_seconds if self.compute_seconds else 0.0
        m["memory.host_peak_bytes"] = float(self.host_peak_bytes)
        m["memory.device_peak_bytes"] = float(self.device_peak_bytes)
        m["output.bytes"] = float(self.output_bytes)
        m["data.rows_written"] = float(self.rows_written)
        m["output.bytes_per_row"] = self.output_bytes / self.rows_written if self.rows_written else 0.0
        for k, v in self.quality.items():
            m[f"quality.{k}"] = v
        m.update(self.extra)
        return m

    def stage_table(self) -> list[dict[str, float | str]]:
        e2e = self.e2e_seconds or 1.0
        return [{"stage": s.name, "seconds": s.seconds, "rows": s.rows, "rows_per_s": s.rows_per_s,
                 "share": s.seconds / e2e} for s in self.stages.values()]

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=float)


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
    quantized: dict | None = None  # the stored payload (fp8 native use); never logged

    def metrics(self) -> dict[str, float]:
        return {
            "checkpoint.bytes": float(self.bytes),
            "checkpoint.load_seconds": self.load_seconds,
            "memory.host_after_load_bytes": float(self.host_after_load_bytes),
            "memory.model_bytes_after_load": float(self.model_bytes_after_load),
            "memory.model_bytes_fp32": float(self.model_bytes_fp32),
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
        m = {"backend.load_seconds": self.load_seconds, "backend.model_bytes": float(self.model_bytes)}
        for phase, n in self.graph_breaks_warmup.items():
            key = "compute" if phase == "predict" else f"compute.{phase}"
            m[f"{key}.graph_breaks_warmup"] = float(n)
        if self.export_seconds is not None:
            m["export.seconds"] = self.export_seconds
            m["export.bytes"] = float(self.export_bytes or 0)
        if self.quantize_seconds is not None:
            m["export.quantize_seconds"] = self.quantize_seconds
        return m
