"""``schema:``: the root table and its (nested) repeated branches."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tasks.spec.base import Strict

ColumnKind = Literal["numeric", "category", "timestamp", "text"]


class OrderBy(Strict):
    column: str
    descending: bool = False


class Branch(Strict):
    name: str
    table: str
    parent_key: str = Field(description="column of this branch's table that points at the parent key")
    key: str | None = Field(None, description="this branch's own key; needed by nested branches")
    order_by: OrderBy | None = None
    time: str | None = Field(
        None,
        description="this table's time column: when schema.root.seed_time is set, rows whose time is after the "
        "root row's seed time (or null) are left out before ordering, max_length and overflow apply",
    )
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
    key: str = Field(description="identifies a root row: unique per row")
    columns: dict[str, ColumnKind] = Field(default_factory=dict)
    entity: str | None = Field(
        None,
        description="the column the top-level branches' parent_key points at (default: key); a time-anchored "
        "root row is (entity, seed time), so several rows share one entity",
    )
    seed_time: str | None = Field(
        None,
        description="each row's seed time: branch rows with a 'time' after it never reach the model "
        "(the as-of rule, tasks/stages/asof.py)",
    )
    split: str | None = Field(
        None,
        description="column holding 'train', 'val' or 'test' per row: train rows train, val rows fit the "
        "calibration, test rows are scored (quality.*); unset: a stable hash of the key and "
        "task.validation_fraction",
    )


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

    @property
    def as_of(self) -> bool:
        """Whether branch rows are filtered by each root row's seed time."""
        return self.root.seed_time is not None

    @model_validator(mode="after")
    def _times_need_seed(self) -> Schema:
        timed = [b.name for b, _ in self.walk() if b.time is not None]
        if timed and self.root.seed_time is None:
            raise ValueError(
                f"branch(es) {timed} set 'time' but schema.root.seed_time is unset: set it to the root "
                "column holding each row's seed time, or remove 'time'"
            )
        return self

    @model_validator(mode="after")
    def _unique_names(self) -> Schema:
        names = [b.name for b, _ in self.walk()]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"branch names must be unique, repeated: {dupes}")
        if "root" in names:
            raise ValueError("'root' is reserved for the root node; rename that branch")
        return self
