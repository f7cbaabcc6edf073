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

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSize:
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        return self
