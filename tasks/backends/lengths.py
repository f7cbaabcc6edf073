"""Reserved lengths: the one rule every path that runs or loads a model applies.

A training run reserves ``min(max_length, observed rows per parent)`` rows in each branch
(at least 1; tasks/run/checks/memory_budget.py), so its checkpoint, and every bundle exported
from it, can hold lengths below the spec's ``max_length``. A saved model fixes its lengths
(its row-position embeddings have that size): where the saved length is at most the spec's
``max_length`` it is the length, on every path (plan's data checks, ``run.checkpoint``,
``run.onnxruntime.model``, the export after training and the ``export`` command). A saved
length above ``max_length`` is not this spec's model: the comparison refuses it.
"""

from __future__ import annotations

from typing import Any

from model.schema import ModelSchema
from tasks.spec import Spec


def reserved_length(max_length: int, saved: int | None, observed: int | None) -> int:
    """Rows one branch reserves per parent row: a saved model's length when it fits the spec,
    else the data's observed maximum (``None``: unknown), capped by ``max_length``, at least 1."""
    if saved is not None and saved <= max_length:
        return saved
    return max(1, min(max_length, max_length if observed is None else observed))


def saved_lengths(schema: ModelSchema) -> dict[str, int]:
    """Branch -> the rows a saved model reserves per parent row."""
    return {n.name: n.max_length for n in schema.root.walk() if n is not schema.root}


def with_lengths(spec: Spec, lengths: dict[str, int]) -> Spec:
    """The spec with each branch's max_length replaced (the params keep the configured one)."""
    raw = spec.to_dict()

    def visit(branches: list[dict[str, Any]]) -> None:
        for b in branches:
            b["max_length"] = lengths.get(b["name"], b["max_length"])
            visit(b.get("branches", []))

    visit(raw["schema"]["branches"])
    return Spec.model_validate(raw)


def spec_for_saved(spec: Spec, schema: ModelSchema) -> Spec:
    """The spec a saved model runs under: its lengths where the rule keeps them."""
    saved = saved_lengths(schema)
    lengths = {b.name: reserved_length(b.max_length, saved.get(b.name), None) for b, _ in spec.schema_.walk()}
    return with_lengths(spec, lengths)
