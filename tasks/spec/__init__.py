"""The benchmark spec: one YAML file = one workload, validated before any work.

Pydantic models with ``extra="forbid"`` so a typo fails fast. ``load_spec`` turns every
validation error into one paragraph that names the key path and the fix; CLI overrides
(``--set run.batch_size=512``) are applied to the raw YAML and validated the same way.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tasks.runtime.errors import UserError

ColumnKind = Literal["numeric", "category", "timestamp", "text"]
SourceFormat = Literal["parquet", "ipc", "csv"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OrderBy(Strict):
    column: str
    descending: bool = False


class Branch(Strict):
    name: str
    table: str
    parent_key: str = Field(description="column of this branch's table that points at the parent key")
    key: str | None = Field(None, description="this branch's own key; needed by nested branches")
    order_by: OrderBy | None = None
    max_length: int = Field(gt=0, description="reserved rows per parent row")
    overflow: Literal["keep_first", "keep_last", "sample", "error"] = "keep_first"
    reduce: Literal["mean", "attention"] = "mean"
    columns: dict[str, ColumnKind] = Field(default_factory=dict)
    branches: list[Branch] = Field(default_factory=list)

    @model_validator(mode="after")
    def _nested_needs_key(self) -> Branch:
        if self.branches and not self.key:
            raise ValueError(
                f"branch '{self.name}' has nested branches, so it needs 'key' (its own key "
                "column, which the nested branches' parent_key points at)"
            )
        return self


class Root(Strict):
    table: str
    key: str
    columns: dict[str, ColumnKind] = Field(default_factory=dict)


class Schema(Strict):
    root: Root
    branches: list[Branch] = Field(default_factory=list)

    def walk(self) -> list[tuple[Branch, str | None]]:
        """Every branch with its parent's name (None = root), parents first."""
        out: list[tuple[Branch, str | None]] = []

        def visit(branches: list[Branch], parent: str | None) -> None:
            for b in branches:
                out.append((b, parent))
                visit(b.branches, b.name)

        visit(self.branches, None)
        return out

    @model_validator(mode="after")
    def _unique_names(self) -> Schema:
        names = [b.name for b, _ in self.walk()]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"branch names must be unique, repeated: {dupes}")
        if "root" in names:
            raise ValueError("'root' is reserved for the root node; rename that branch")
        return self


class TpchSource(Strict):
    scale: float = Field(0.01, gt=0, le=1000)


class Generate(Strict):
    tpch: TpchSource


class Database(Strict):
    url: str = Field(
        description="'duckdb' (the file built from the generated TPC-H), "
        "'duckdb:<path>', or 'postgresql://user@host:port/db'; ${VAR} is read from "
        "the environment, the password best from PGPASSWORD"
    )


# What pandas.read_csv reads as missing by default (its ``na_values`` defaults), so a CSV
# that opens cleanly in pandas or R opens the same way here.
PANDAS_NULL_VALUES = (
    "",
    "#N/A",
    "#N/A N/A",
    "#NA",
    "-1.#IND",
    "-1.#QNAN",
    "-NaN",
    "-nan",
    "1.#IND",
    "1.#QNAN",
    "<NA>",
    "N/A",
    "NA",
    "NULL",
    "NaN",
    "None",
    "n/a",
    "nan",
    "null",
)


class CsvOptions(Strict):
    """How CSV tables are read: the same settings in the up-front checks and in retrieve."""

    null_values: list[str] = Field(
        default_factory=lambda: list(PANDAS_NULL_VALUES),
        description="cells read as null in every column (replaces the default list: pandas' default NA markers)",
    )
    separator: str = Field(",", description="one single-byte character, e.g. ';' or '\\t'")
    quote_char: str | None = Field('"', description="null: quotes are ordinary characters")
    encoding: str = Field(
        "utf8", description="utf8, utf8-lossy, or any Python codec (e.g. latin-1, cp1252: decoded in memory)"
    )
    has_header: bool = Field(True, description="false: columns are named column_1, column_2, ...")
    infer_schema_rows: int | None = Field(
        None, gt=0, description="rows read to infer column types; null = the whole file"
    )
    decimal_comma: bool = Field(False, description="numbers written 1,5 (needs separator != ',')")

    @field_validator("separator")
    @classmethod
    def _one_byte(cls, v: str) -> str:
        if len(v.encode()) != 1:
            raise ValueError("must be exactly one single-byte character, e.g. ',' ';' '|' or a tab")
        return v

    @field_validator("quote_char")
    @classmethod
    def _one_byte_quote(cls, v: str | None) -> str | None:
        if v is not None and len(v.encode()) != 1:
            raise ValueError("must be one single-byte character (or null for no quoting)")
        return v

    @field_validator("encoding")
    @classmethod
    def _known_codec(cls, v: str) -> str:
        import codecs

        if v not in ("utf8", "utf8-lossy"):
            try:
                codecs.lookup(v)
            except LookupError:
                raise ValueError(
                    "unknown encoding; use utf8, utf8-lossy or a Python codec name such as latin-1 or cp1252"
                ) from None
        return v

    @model_validator(mode="after")
    def _comma_clash(self) -> CsvOptions:
        if self.decimal_comma and self.separator == ",":
            raise ValueError("decimal_comma needs a separator other than ','")
        return self


class Source(Strict):
    database: Database | None = Field(None, description="read the schema's tables from this database instead of files")
    tables: dict[str, str] = Field(
        default_factory=dict,
        description="table name -> path (Parquet/IPC/CSV); relative paths resolve against "
        "the data folder when generated, else the spec's folder",
    )
    format: SourceFormat | None = Field(None, description="default: from the file suffix")
    csv: CsvOptions = Field(default_factory=CsvOptions)
    generate: Generate | None = None

    @model_validator(mode="after")
    def _no_password_in_url(self) -> Source:
        # The spec travels to Prefect, MLflow params and spec.yaml: a password must not.
        from tasks.runtime.masking import literal_password, mask_secrets

        if self.database is not None and literal_password(self.database.url):
            raise ValueError(
                f"source.database.url {mask_secrets(self.database.url)} carries a password; "
                "remove it and export PGPASSWORD (or write ${VAR} in the URL and export VAR)"
            )
        return self


class Task(Strict):
    target: str
    branch: str | None = Field(None, description="branch holding the target; None = root")
    kind: Literal["category", "binary", "regression"]
    outputs: list[str] = Field(default_factory=lambda: ["prediction"])
    validation_fraction: float = Field(0.2, gt=0, lt=1)
    min_quality: float | None = Field(
        None, description="validity floor for the headline metric (accuracy/auc; for regression a ceiling on mae)"
    )

    @field_validator("outputs")
    @classmethod
    def _known_outputs(cls, v: list[str]) -> list[str]:
        for name in v:
            head = name.split(":", 1)[0]
            if head not in {"prediction", "root_embedding", "branch_embedding", "leaf", "topk"}:
                raise ValueError(
                    f"unknown output '{name}'; choose from prediction, root_embedding, "
                    "branch_embedding:<branch>, leaf:<branch>, topk:<k>"
                )
        return v


class ModelSize(Strict):
    d_model: int = Field(64, gt=0)
    layers: int = Field(2, ge=1)
    heads: int = Field(4, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSize:
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        return self


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
    intra_op_threads: int = Field(0, ge=0, description="0 = ONNX Runtime's default (one per core)")
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
    """Data-parallel training with PyTorch DDP, launched by torchrun (``tasks/distributed/launch.py``)."""

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
    latency_bound_ms: float = Field(100.0, gt=0, description="server: an early-stopping p99 above it is INVALID")
    min_duration_s: float = Field(60.0, ge=0, description="shorter runs are INVALID")
    min_requests: int = Field(1024, ge=1, description="fewer requests are INVALID")


class Run(Strict):
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
    repeats: int = Field(1, ge=1, description="predict passes; >=2 adds medians, >=6 their 95% intervals")
    min_steady_batches: int = Field(10, ge=0, description="validity: fewer makes the run INVALID")
    min_steady_seconds: float = Field(1.0, ge=0, description="validity: less makes the run INVALID")
    max_recompiles: int = Field(0, ge=0, description="validity: recompiles after warm-up allowed")
    max_host_load: float | None = Field(
        0.5,
        gt=0,
        description="validity: share of all cores other processes may use just before "
        "(0.5 s window) and during the timed region (other work slows torch 10x+)",
    )
    chunk_rows: int = Field(50_000, gt=0, description="root rows per retrieve..write chunk")
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
        "(default: half of the memory available at start; tasks/checks/memory_budget.py)",
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

    @model_validator(mode="after")
    def _repeats_are_offline(self) -> Run:
        if self.scenario != "offline" and self.repeats > 1:
            raise ValueError(
                f"run.repeats ({self.repeats}) repeats offline predict passes; a {self.scenario} "
                "run measures many requests instead: set run.repeats: 1 or run.scenario: offline"
            )
        return self

    @model_validator(mode="after")
    def _backend_settings(self) -> Run:
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

    @field_validator("packing", mode="before")
    @classmethod
    def _bare_off(cls, v: Any) -> Any:
        """YAML reads a bare ``off`` (``packing: off``, ``--set run.packing=off``) as false."""
        return "off" if v is False else v

    @field_validator("bucketing", mode="before")
    @classmethod
    def _bare_off_bucketing(cls, v: Any) -> Any:
        return "off" if v is False else v


class Spec(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    source: Source
    schema_: Schema = Field(alias="schema")
    task: Task
    model: ModelSize = Field(default_factory=ModelSize)
    run: Run = Field(default_factory=Run)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _cross_checks(self) -> Spec:
        branches = {b.name: b for b, _ in self.schema_.walk()}
        tables = {self.schema_.root.table, *(b.table for b in branches.values())}
        missing = sorted(t for t in tables if t not in self.source.tables)
        if missing and self.source.database is None:  # a database holds tables by name
            raise ValueError(
                f"schema uses table(s) {missing} that source.tables does not list; add "
                "'source.tables.<name>: <path>' for each"
            )
        if self.task.branch is not None and self.task.branch not in branches:
            raise ValueError(
                f"task.branch '{self.task.branch}' is not a branch of the schema; use one of "
                f"{sorted(branches)} or leave it unset for a root target"
            )
        for out in self.task.outputs:
            head, _, arg = out.partition(":")
            if head in {"branch_embedding", "leaf"} and arg not in branches:
                raise ValueError(f"task.outputs '{out}' names no branch; use one of {sorted(branches)}")
            if head == "topk" and (not arg.isdigit() or int(arg) < 1):
                raise ValueError(f"task.outputs '{out}': k must be a positive integer")
            if head == "topk" and self.task.kind != "category":
                raise ValueError(f"task.outputs '{out}' needs task.kind 'category'")
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @property
    def spec_hash(self) -> str:
        """Hash of the workload definition, independent of key order and formatting."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _set_path(raw: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``a.b.c`` in nested dicts; list items are addressed by branch name."""
    node: Any = raw
    parts = dotted.split(".")
    for part in parts[:-1]:
        if isinstance(node, list):
            match = [b for b in node if isinstance(b, dict) and b.get("name") == part]
            if not match:
                raise UserError(f"--set {dotted}: no branch named '{part}' at this level.")
            node = match[0]
            continue
        if not isinstance(node, dict):
            raise UserError(f"--set {dotted}: '{part}' is not a section, so it has no keys.")
        node = node.setdefault(part, {})
    if not isinstance(node, dict):
        raise UserError(f"--set {dotted}: the parent of '{parts[-1]}' is not a section.")
    node[parts[-1]] = value


def branch_path(raw: dict[str, Any], dotted: str) -> str:
    """Let users write ``lineitem.max_length`` for a branch anywhere in the tree."""
    first = dotted.split(".", 1)[0]
    if first in {"name", "source", "schema", "task", "model", "run"}:
        return dotted

    def find(branches: list[Any], trail: str) -> str | None:
        for b in branches or []:
            if isinstance(b, dict) and b.get("name") == first:
                return f"{trail}.{first}"
            hit = find(b.get("branches", []) if isinstance(b, dict) else [], f"{trail}.{b.get('name')}.branches")
            if hit:
                return hit
        return None

    hit = find(raw.get("schema", {}).get("branches", []), "schema.branches")
    if hit is None:
        raise UserError(
            f"--set {dotted}: '{first}' is neither a top-level section (name, source, schema, "
            "task, model, run) nor a branch name."
        )
    return hit + dotted[len(first) :]


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        if "=" not in item:
            raise UserError(f"--set '{item}' must look like key.path=value, e.g. run.batch_size=512")
        key, text = item.split("=", 1)
        _set_path(raw, branch_path(raw, key.strip()), yaml.safe_load(text))
    return raw


def _key_path(loc: tuple[Any, ...], raw: Any) -> str:
    """Pydantic's location as the user writes it: list items by branch name, not index."""
    parts, node = [], raw
    for p in loc:
        if isinstance(node, list) and isinstance(p, int) and p < len(node):
            node = node[p]
            name = node.get("name") if isinstance(node, dict) else None
            parts.append(str(name) if isinstance(name, str) and name else str(p))
            continue
        parts.append(str(p))
        node = node.get(p) if isinstance(node, dict) else None
    return ".".join(parts)


def _describe(err: ValidationError, source: str, raw: Any = None) -> str:
    lines = []
    for e in err.errors():
        loc = _key_path(e["loc"], raw) or "(top level)"
        if e["type"] == "extra_forbidden":
            msg = f"unknown key '{loc}'; remove it or fix its spelling"
        elif e["type"] == "missing":
            msg = f"'{loc}' is required; add it"
        else:
            got = e.get("input")
            shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
            msg = f"'{loc}': {e['msg']}{shown}"
        lines.append(msg)
    return f"Invalid benchmark spec {source}: " + "; ".join(lines) + "."


def parse_spec(raw: dict[str, Any], source: str = "") -> Spec:
    try:
        return Spec.model_validate(raw)
    except ValidationError as err:
        raise UserError(_describe(err, source, raw)) from None


def read_spec_file(path: str | Path) -> dict[str, Any]:
    """The spec file's top-level mapping, or a ``UserError`` naming what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"Spec file '{path}' does not exist; pass the path of a benchmark YAML.")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise UserError(
            f"Spec file '{path}' is not UTF-8 text (byte {err.object[err.start]:#x} at offset "
            f"{err.start}); save it as UTF-8."
        ) from None
    except yaml.YAMLError as err:
        raise UserError(f"Spec file '{path}' is not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise UserError(f"Spec file '{path}' must hold a mapping at the top level.")
    return raw


def load_spec(path: str | Path, overrides: list[str] | None = None) -> Spec:
    raw = read_spec_file(path)
    # Harness sections (tasks/spec/sections.py) describe how to run a workload, not the workload.
    raw = {k: v for k, v in raw.items() if k not in ("sweep", "schedule")}
    raw = apply_overrides(raw, overrides or [])
    return parse_spec(raw, f"'{path}'")
