"""``run:``: how the workload is executed and measured (scenario, compile, backend, validity floors)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from tasks.spec.base import Strict


class CompileSettings(Strict):
    encoders: bool = False
    pools: bool = False
    model: bool = Field(
        False,
        description="whole model under torch.compile(dynamic=True); graph "
        "breaks allowed and counted (not with encoders/pools)",
    )
    backend: str = "inductor"
    dynamic: bool | None = None
    mode: str | None = Field(None, description="torch.compile mode, e.g. max-autotune-no-cudagraphs")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="torch.compile options (Inductor config keys), applied over the harness defaults",
    )

    @model_validator(mode="after")
    def _whole_or_regions(self) -> CompileSettings:
        if self.model and (self.encoders or self.pools):
            raise ValueError(
                "run.compile.model compiles the whole model; set encoders and pools "
                "to false with it (regions inside a compiled model are not separate)"
            )
        return self


class AdamWSettings(Strict):
    fused: bool | None = Field(True, description="fused kernel (true), for-each (false), torch's choice (null)")
    weight_decay: float = Field(0.01, ge=0, description="decoupled weight decay (not on biases/norms)")


class OnnxRuntime(Strict):
    model: str | None = Field(
        None, description="bundle folder from relflow-bench export; null: the run exports the checkpoint it uses first"
    )
    providers: list[str] = Field(default_factory=lambda: ["CPUExecutionProvider"], min_length=1)
    intra_op_threads: int = Field(
        0,
        ge=0,
        description="0 = torch's intra-op thread count when the session is made (like for like with PyTorch; "
        "tag relflow.torch_threads); fixed then: a request scenario's run.request.intra_op_threads does not "
        "change it, and the run's predict MFU peak and floors are at it (compute.predict.intra_op_threads)",
    )
    inter_op_threads: int = Field(0, ge=0)
    graph_optimization_level: Literal["disable", "basic", "extended", "all"] = "all"
    quantization: Literal["dynamic_int8"] | None = Field(
        None, description="serve ONNX Runtime's dynamic int8 quantization of the bundle's model"
    )


class Loader(Strict):
    num_workers: int = Field(0, ge=0)
    persistent_workers: bool = False
    pin_memory: bool = False
    prefetch_factor: int = Field(2, ge=1)


class Distributed(Strict):
    """Data-parallel training with PyTorch DDP, launched by torchrun (``tasks/run/distributed/launch.py``)."""

    processes: int = Field(2, ge=1, description="training processes (ranks) on this host")
    backend: Literal["gloo", "nccl"] = Field("gloo", description="gloo (CPU) or nccl (one CUDA device per rank)")
    threads_per_process: int = Field(1, ge=1, description="torch threads in every rank (held fixed for scaling)")
    reference: bool = Field(True, description="also time a 1-process run for compute.train.scaling_efficiency")


class Threads(Strict):
    intra_op: int | None = Field(
        None,
        ge=1,
        description="torch.set_num_threads; unset = leave torch's default (an explicit "
        "setting equal to the default can still run slower: see the README)",
    )
    inter_op: int | None = Field(None, ge=1, description="torch.set_num_interop_threads; unset = default")


class TextEncoder(Strict):
    """The application's text encoder: runs outside the model, timed as the ``encode`` step."""

    encoder: str = Field(
        "hashed",
        description="'hashed' (deterministic character/word n-gram hashing, no "
        "weights) or a plug-in 'module:function' (Arrow string array -> float32 [n, dim])",
    )
    dim: int = Field(64, gt=0, le=65_536, description="width of each text cell's vector")

    @field_validator("encoder")
    @classmethod
    def _encoder_form(cls, v: str) -> str:
        if v != "hashed" and (v.count(":") != 1 or not all(v.split(":"))):
            raise ValueError(f"'{v}' is neither 'hashed' nor an import path 'module:function'")
        return v


class Request(Strict):
    """Request scenarios (single_stream, server); LoadGen-style minimums."""

    roots: int = Field(1, gt=0, description="root keys per request, drawn from validation keys")
    target_qps: float = Field(10.0, gt=0, description="server: Poisson arrival rate")
    max_batch: int = Field(1, ge=1, description="server: requests served together at most")
    max_wait_ms: float = Field(
        0.0, ge=0, description="server: how long the oldest queued request may wait for a batch to fill"
    )
    latency_bound_ms: float = Field(
        100.0,
        gt=0,
        description="server: the p99 bound of LoadGen's server rule (latency.request_ms.p99_server_rule above it "
        "is INVALID; tasks/run/scenarios/README.md)",
    )
    intra_op_threads: int | None = Field(
        1,
        ge=1,
        description="torch intra-op threads while requests are served (cold request included), restored "
        "after; null = the run's own setting (run.threads.intra_op or torch's). One by default: a request's "
        "ops are too small to split, and every split waits for a second thread the host may not give "
        "(tasks/run/scenarios/README.md, Low load)",
    )
    min_duration_s: float = Field(60.0, ge=0, description="shorter runs are INVALID")
    min_requests: int = Field(1024, ge=1, description="fewer requests are INVALID")
    trace_sample_rate: float = Field(
        0.01,
        description="share of steady requests logged as MLflow traces (seeded by run.seed), "
        "besides the 10 slowest, which always are",
    )
    check_outputs: bool = Field(
        True,
        description="compare each served root's predictions with an offline pass over the same keys (same "
        "weights, backend and calibration), after the timed region; beyond the tolerance (tasks/spec/tolerance.py) "
        "the run is INVALID",
    )

    @field_validator("trace_sample_rate")
    @classmethod
    def _a_share(cls, v: float) -> float:
        if not 0 <= v <= 1:  # also refuses NaN
            raise ValueError(
                f"{v} is not a share of the requests; set it from 0 (only the 10 slowest are "
                "traced) to 1 (every request), default 0.01"
            )
        return v


class RunSettings(Strict):
    """The spec's ``run:`` section: how the workload is run and measured."""

    scenario: Literal["offline", "single_stream", "server"] = Field(
        "offline",
        description="offline: every root row in chunks; single_stream / server: timed requests (see run.request)",
    )
    request: Request = Field(default_factory=Request)
    mode: Literal["train+predict", "predict"] = "train+predict"
    batch_size: int = Field(256, gt=0)
    epochs: int = Field(1, ge=1)
    learning_rate: float = Field(1e-3, gt=0, description="AdamW learning rate")
    adamw: AdamWSettings = Field(default_factory=AdamWSettings)
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    packing: Literal["auto", "off"] = "auto"
    bucketing: Literal["off", "by_length"] = Field(
        "off",
        description="by_length: batches of roots with similar present cells, each padded "
        "only to its own longest context (off: every batch padded to the schema's reserved shape)",
    )
    bucket_count: int = Field(
        8,
        ge=1,
        description="by_length: equal-count groups of roots sorted by present cells; "
        "training shuffles within each and the batch order; compiled regions pad to the "
        "bucket's longest context, so at most this many shapes",
    )
    text: TextEncoder = Field(default_factory=TextEncoder)
    compile: CompileSettings = Field(default_factory=CompileSettings)
    loader: Loader = Field(default_factory=Loader)
    warmup_batches: int = Field(2, ge=0)
    repeats: int = Field(
        1,
        ge=1,
        description="predict passes; from 3, medians over passes 1.. (pass 0 holds the first call), "
        "from 7 their 95% intervals",
    )
    min_steady_batches: int = Field(10, description="validity: fewer makes the run INVALID (at least 1)")
    min_steady_seconds: float = Field(1.0, description="validity: less makes the run INVALID (above 0)")
    max_recompiles: int = Field(0, ge=0, description="validity: recompiles after warm-up allowed")
    max_host_load: float | None = Field(
        0.5,
        gt=0,
        description="validity: share of all cores other processes may use just before "
        "(0.5 s window) and during the timed region (other work slows torch 10x+)",
    )
    chunk_rows: int = Field(50_000, gt=0, description="root rows per retrieve..write chunk")
    max_minutes: float | None = Field(
        None,
        description="stop the run (exit 2, its MLflow run FAILED, its outputs removed) when the timed region's "
        "projection after its first steady batches (run.projected_seconds) exceeds this many minutes; null: no limit",
    )
    seed: int = 0
    system_metrics_interval_s: float = Field(
        5.0,
        ge=0,
        description="MLflow system metrics sampling (0 = off); sampled in memory during "
        "the timed region and logged after it",
    )
    device: str = "auto"
    threads: Threads = Field(default_factory=Threads)
    profile: bool = Field(
        False,
        description="torch.profiler over run.profile_batches steady batches per "
        "phase; the run is tagged relflow.profiled and left out of history/compare",
    )
    profile_batches: int = Field(5, ge=1)
    checkpoint: str | None = Field(
        None,
        description="checkpoint to load: predict uses its weights (any weight format: fp32, fp16, "
        "int8, int4, fp8); train+predict resumes training from it (optimizer state and settings)",
    )
    output_dir: str = "outputs"
    max_memory_bytes: int | None = Field(
        None,
        gt=0,
        description="refuse a run whose estimated chunk memory exceeds this "
        "(default: half of the memory available at start; tasks/run/checks/memory_budget.py)",
    )
    distributed: Distributed | None = Field(None, description="train with DDP over several processes")
    backend: Literal["pytorch", "onnxruntime", "triton"] = Field(
        "pytorch",
        description="serves the predict passes: pytorch, onnxruntime, or triton (this project's "
        "Triton kernels on CUDA; TRITON_INTERPRET=1 runs them on CPU for correctness only)",
    )
    onnxruntime: OnnxRuntime = Field(default_factory=OnnxRuntime)
    reference_checkpoint: str | None = Field(
        None,
        description="checkpoint whose held-out quality is the reference (the fp16 version "
        "of the same trained checkpoint): logs quality.delta_vs_reference",
    )
    max_quality_drop: float | None = Field(
        None,
        ge=0,
        description="validity: INVALID when the headline quality is worse than the "
        "reference's by more than this (needs run.reference_checkpoint)",
    )
    check_outputs: bool = Field(
        False,
        description="offline: compare the last pass's predictions with a plain pass (no bucketing, padded, "
        "PyTorch eager) over the same keys after the timed region; INVALID beyond the tolerance "
        "(tasks/spec/tolerance.py). Request scenarios: run.request.check_outputs",
    )

    @model_validator(mode="after")
    def _check_outputs_offline(self) -> RunSettings:
        if self.check_outputs and self.scenario != "offline":
            raise ValueError(
                f"run.check_outputs compares offline passes; a {self.scenario} run checks its served outputs "
                "with run.request.check_outputs (default true): drop run.check_outputs or set run.scenario: offline"
            )
        return self

    @model_validator(mode="after")
    def _repeats_are_offline(self) -> RunSettings:
        if self.scenario != "offline" and self.repeats > 1:
            raise ValueError(
                f"run.repeats ({self.repeats}) repeats offline predict passes; a {self.scenario} "
                "run measures many requests instead: set run.repeats: 1 or run.scenario: offline"
            )
        return self

    @model_validator(mode="after")
    def _backend_settings(self) -> RunSettings:
        if self.backend == "onnxruntime":
            c = self.compile
            if c.encoders or c.pools or c.model:
                raise ValueError(
                    "run.compile applies to the PyTorch backend; with run.backend "
                    "onnxruntime set run.compile.* to false"
                )
            if self.precision != "fp32":
                raise ValueError(
                    "run.backend onnxruntime serves the fp32 export; set run.precision "
                    "fp32 (or use run.onnxruntime.quantization: dynamic_int8)"
                )
            if self.onnxruntime.model and self.mode == "train+predict":
                raise ValueError(
                    "run.onnxruntime.model serves an exported bundle, so the run cannot "
                    "train; set run.mode predict, or drop run.onnxruntime.model to "
                    "export the trained checkpoint"
                )
        if self.backend == "triton":
            c = self.compile
            if c.encoders or c.pools or c.model:
                raise ValueError(
                    "run.compile applies to the PyTorch backend; with run.backend triton "
                    "(its own kernels) set run.compile.* to false"
                )
            if self.packing == "off":
                raise ValueError(
                    "run.backend triton serves packed attention only; set run.packing auto, "
                    "or use run.backend pytorch for the padded path"
                )
        if self.reference_checkpoint and self.mode != "predict":
            raise ValueError(
                "run.reference_checkpoint compares the served checkpoint with its fp16 "
                "version, so it needs run.mode predict with run.checkpoint (or a bundle)"
            )
        if self.max_quality_drop is not None and not self.reference_checkpoint:
            raise ValueError(
                "run.max_quality_drop needs run.reference_checkpoint (the checkpoint the drop is measured against)"
            )
        return self

    @field_validator("min_steady_batches", "min_steady_seconds")
    @classmethod
    def _some_steady_state(cls, v: float, info: ValidationInfo) -> float:
        # 0 let a run with no steady batch at all be VALID and publish steady rows/s of 0.
        if not v > 0:  # also refuses NaN
            fix = "1 or more" if info.field_name == "min_steady_batches" else "above 0 (e.g. 0.001)"
            raise ValueError(
                f"{v} would let a run without any steady-state batch be VALID (its steady rows/s "
                f"would be 0); set it to {fix}, default {cls.model_fields[str(info.field_name)].default}"
            )
        return v

    @field_validator("max_minutes")
    @classmethod
    def _positive_minutes(cls, v: float | None) -> float | None:
        if v is not None and not (v > 0 and v != float("inf")):  # also refuses NaN
            raise ValueError(
                f"{v} is not a time limit: set run.max_minutes to a number of minutes above 0 (e.g. 30), "
                "or null for no limit"
            )
        return v

    @field_validator("packing", mode="before")
    @classmethod
    def _bare_off(cls, v: Any) -> Any:
        """YAML reads a bare ``off`` (``packing: off``, ``--set run.packing=off``) as false."""
        return "off" if v is False else v

    @field_validator("bucketing", mode="before")
    @classmethod
    def _bare_off_bucketing(cls, v: Any) -> Any:
        return "off" if v is False else v
