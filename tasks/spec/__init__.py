"""The benchmark spec: one YAML file = one workload, validated before any work.

Pydantic models with ``extra="forbid"`` so a typo fails fast. ``load_spec`` turns every
validation error into one paragraph that names the key path and the fix; CLI overrides
(``--set run.batch_size=512``) are applied to the raw YAML and validated the same way.

Sections, one module each: ``source``, ``schema``, ``task`` (task + model), ``run``;
``workload`` holds ``Spec`` and its cross-section checks, ``parse`` reads files and
overrides; ``sections`` the harness-only ``sweep:``/``schedule:`` sections.
"""

from tasks.spec.base import Strict
from tasks.spec.parse import (
    MAX_SPEC_BYTES,
    MAX_SPEC_DEPTH,
    apply_overrides,
    branch_path,
    load_spec,
    load_yaml,
    parse_spec,
    read_spec_file,
)
from tasks.spec.run import (
    AdamWSettings,
    CompileSettings,
    Distributed,
    Loader,
    OnnxRuntime,
    Request,
    RunSettings,
    TextEncoder,
    Threads,
)
from tasks.spec.schema import Branch, ColumnKind, OrderBy, Root, Schema
from tasks.spec.source import (
    PANDAS_NULL_VALUES,
    CsvOptions,
    Database,
    Generate,
    RelBench,
    Source,
    SourceFormat,
    TpchSource,
)
from tasks.spec.task import ContextBuilder, ModelSize, RTContext, RTSettings, Task
from tasks.spec.workload import Spec

__all__ = [
    "MAX_SPEC_BYTES",
    "MAX_SPEC_DEPTH",
    "load_yaml",
    "PANDAS_NULL_VALUES",
    "AdamWSettings",
    "Branch",
    "ColumnKind",
    "CompileSettings",
    "CsvOptions",
    "Database",
    "Distributed",
    "Generate",
    "Loader",
    "ModelSize",
    "RTContext",
    "RTSettings",
    "ContextBuilder",
    "OnnxRuntime",
    "OrderBy",
    "RelBench",
    "Request",
    "Root",
    "RunSettings",
    "Schema",
    "Source",
    "SourceFormat",
    "Spec",
    "Strict",
    "Task",
    "TextEncoder",
    "Threads",
    "TpchSource",
    "apply_overrides",
    "branch_path",
    "load_spec",
    "parse_spec",
    "read_spec_file",
]
