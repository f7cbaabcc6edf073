"""What a run read and what its model takes: plain descriptions for the run's record.

``describe_sources`` turns each source table into a ``DatasetInfo`` (name, where it was read
from, a digest, its Arrow schema); ``model_input_schema`` is the model's input as one nested
Arrow schema (root columns, each branch a list of structs of its columns). Neither reads
table data: digests come from file metadata (name, size, modification time) and the schema,
so they change when the data does and cost nothing on large tables (a database table's digest
covers its location, name and schema only: nothing is queried). ``tasks.tracking.writer`` turns
them into MLflow dataset inputs and a model signature.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import torch

import model as model_package
from model import ModelConfig, ModelSchema
from model.meta import output_shapes_on_meta
from tasks.runtime.masking import mask_uri
from tasks.sources.databases import DatabaseTable
from tasks.sources.tables import Sources, Table
from tasks.spec import Branch, ColumnKind, Spec


@dataclass(frozen=True)
class DatasetInfo:
    name: str  # the spec's table name
    source: str  # file or folder path, or a database URL, masked (tasks/runtime/masking.py)
    digest: str
    schema: pa.Schema
    context: str  # how the run used it: the spec's run.mode (train+predict | predict)


def _source_location(src: Table) -> str:
    if isinstance(src, DatabaseTable):
        db = src.db
        if db.kind == "duckdb":  # shown as duckdb:<file>: the local file
            return str(db.shown).removeprefix("duckdb:")
        return mask_uri(str(db.url))
    return str(src.files[0] if len(src.files) == 1 else src.files[0].parent)


def _digest(src: Table) -> str:
    h = hashlib.sha256(str(src.schema).encode())
    if isinstance(src, DatabaseTable):
        # A database table: its location, name and schema only (no query, so nothing is read).
        h.update(f"{_source_location(src)}\0{src.name}".encode())
        return h.hexdigest()[:12]
    for f in src.files:
        st = f.stat()
        h.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:12]


def describe_sources(spec: Spec, sources: Sources) -> list[DatasetInfo]:
    """One ``DatasetInfo`` per source table, in the spec's order."""
    return [
        DatasetInfo(name, _source_location(src), _digest(src), src.schema, spec.run.mode)
        for name, src in sources.items()
    ]


def _fields(columns: dict[str, ColumnKind], table: pa.Schema, skip: str | None) -> list[pa.Field]:
    return [table.field(c) for c in columns if c in table.names and c != skip]


def model_input_schema(spec: Spec, sources: Sources) -> pa.Schema:
    """The model's input as one nested row per root key: the root's feature columns with their
    source types, and each branch as a list of structs of its columns (nested branches inside).
    The target column is not an input (the model predicts it)."""
    target, holder = spec.task.target, spec.task.branch

    def branch(b: Branch) -> pa.Field:
        skip = target if holder == b.name else None
        inner = _fields(b.columns, sources[b.table].schema, skip) + [branch(c) for c in b.branches]
        return pa.field(b.name, pa.list_(pa.struct(inner)))

    root = spec.schema_.root
    own = _fields(root.columns, sources[root.table].schema, target if holder is None else None)
    return pa.schema(own + [branch(b) for b in spec.schema_.branches])


@dataclass(frozen=True)
class ModelInterface:
    """What ``Tracker.log_model`` records beside the weights."""

    inputs: pa.Schema  # nested rows (``model_input_schema``)
    outputs: dict[str, tuple[str, tuple[int, ...]]]  # name -> (dtype, shape with batch dim -1)
    code_dir: Path  # the ``model`` package, shipped with the logged model
    requirements: list[str]


def model_interface(
    spec: Spec, sources: Sources, schema: ModelSchema, config: ModelConfig, outputs: Iterable[str]
) -> ModelInterface:
    torch_version = torch.__version__.split("+")[0]  # a local tag (+cpu, +cu128) is not on PyPI
    return ModelInterface(
        inputs=model_input_schema(spec, sources),
        outputs=output_shapes_on_meta(schema, config, outputs),
        code_dir=Path(model_package.__file__).resolve().parent,
        requirements=[
            f"torch=={torch_version}",
            f"numpy=={__import__('numpy').__version__}",
            f"pyarrow=={pa.__version__}",
        ],
    )
