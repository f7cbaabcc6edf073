"""``task:`` and ``model:``: what is predicted and how large the model is."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from tasks.spec.base import Strict


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


LibraryName = str
"""The model under test: a name registered in tasks/libraries (``LIBRARIES``, one line per library),
checked with the library's own refusals before work (an unknown name: exit 2 listing them)."""


ContextBuilder = Literal["nested", "rt_utils"]


class RTContext(Strict):
    """``model.rt.context``: how relational-transformers' contexts are built. ``nested`` (the
    default): from the harness's nested row (root, branches, one target cell). ``rt_utils``:
    relational-transformers-utils 0.1.0's ``ColumnarStore`` / ``ColumnarTraversal`` /
    ``ContextGraph`` over a RelBench folder's or the schema's tables and foreign keys, with this cell budget
    (its ``ContextPolicy``; the defaults are the library's). The budget keys are read by
    ``rt_utils`` only (RT's checks refuse them set with ``nested``)."""

    builder: ContextBuilder = Field(
        "nested", description="nested (the harness's nested row) | rt_utils (relational-transformers-utils 0.1.0)"
    )
    max_context_cells: int = Field(2048, gt=0, description="rt_utils: cells per context, at most (the global budget)")
    local_context_cells: int = Field(
        256, gt=0, description="rt_utils: cells one breadth-first expansion may visit from its seed row"
    )
    bfs_width: int = Field(32, ge=0, description="rt_utils: children kept per row in the breadth-first expansion")
    num_walks: int = Field(10_000, ge=0, description="rt_utils: random walks from the target that rank peer rows")
    walk_length: int = Field(20, ge=0, description="rt_utils: steps per random walk")
    prefer_latest: bool = Field(True, description="rt_utils: rank walked peers newest first (else by visits)")
    seed: int | None = Field(None, description="rt_utils: the walks' and expansions' seed; unset: run.seed")


class RTSettings(Strict):
    """``model.rt``: settings read by ``model.library: relational_transformers`` only."""

    context: RTContext = Field(default_factory=RTContext)


class ModelSize(Strict):
    library: LibraryName = Field(
        "reference",
        min_length=1,
        description="the model under test, a library registered in tasks/libraries (reference = model/, relflow, "
        "relational_transformers, lightgbm)",
    )
    d_model: int = Field(64, gt=0)
    layers: int = Field(2, ge=1)
    heads: int = Field(4, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    rt: RTSettings = Field(default_factory=RTSettings, description="relational_transformers only")

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSize:
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        return self
