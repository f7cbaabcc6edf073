"""The whole spec: one YAML file = one workload, with the checks that span sections."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml
from pydantic import ConfigDict, Field, model_validator

from tasks.spec.base import Strict
from tasks.spec.run import RunSettings
from tasks.spec.schema import Schema
from tasks.spec.source import Source
from tasks.spec.task import ModelSize, Task


class Spec(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    source: Source
    schema_: Schema = Field(alias="schema")
    task: Task
    model: ModelSize = Field(default_factory=ModelSize)
    run: RunSettings = Field(default_factory=RunSettings)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _cross_checks(self) -> Spec:
        branches = {b.name: b for b, _ in self.schema_.walk()}
        tables = {self.schema_.root.table, *(b.table for b in branches.values())}
        missing = sorted(t for t in tables if t not in self.source.tables)
        # a database holds tables by name; a RelBench folder holds them under db/ (its task's rows: the root)
        if missing and self.source.database is None and self.source.relbench is None:
            raise ValueError(
                f"schema uses table(s) {missing} that source.tables does not list; add "
                "'source.tables.<name>: <path>' for each"
            )
        if self.task.branch is not None and self.task.branch not in branches:
            raise ValueError(
                f"task.branch '{self.task.branch}' is not a branch of the schema; use one of "
                f"{sorted(branches)} or leave it unset for a root target"
            )
        keys = (
            {"schema.root.key": self.schema_.root.key}
            if self.task.branch is None
            else {
                f"the {k} of branch '{self.task.branch}'": v
                for k, v in (
                    ("parent_key", branches[self.task.branch].parent_key),
                    ("key", branches[self.task.branch].key),
                )
                if v
            }
        )
        for where, key in keys.items():
            if self.task.target == key:
                raise ValueError(
                    f"task.target '{key}' is {where}: a key identifies rows and is not predicted "
                    "(it is read and written as the key column); set task.target to the column to predict"
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
        """Hash of the workload definition, independent of key order and formatting.

        ``model.library: reference`` (the default) is left out, so every spec written before
        the key existed keeps its hash (history and compare group runs by it)."""
        d = self.to_dict()
        if d["model"]["library"] == ModelSize.model_fields["library"].default:
            del d["model"]["library"]
        blob = json.dumps(d, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]
