"""Shared hand-made schemas for the model tests (small, so the suite stays fast)."""

from __future__ import annotations

import pytest
import torch

from model import ColumnDef, ModelConfig, ModelSchema, NodeDef, RelationalTransformer, TargetDef


def num(name: str) -> ColumnDef:
    return ColumnDef(name, "numeric")


def cat(name: str, cardinality: int = 6) -> ColumnDef:
    return ColumnDef(name, "category", cardinality)


def nested_schema(
    target_node: str = "orders",
    target_column: str = "status",
    kind: str = "category",
    line_reduce: str = "attention",
    line_length: int = 3,
) -> ModelSchema:
    """customer -> orders (L=4) -> lineitem (L=3): two nested levels."""
    line = NodeDef(
        "lineitem",
        (num("qty"), num("price"), cat("flag", 4)),
        max_length=line_length,
        reduce=line_reduce,
    )
    orders = NodeDef(
        "orders",
        (num("total"), ColumnDef("date", "timestamp"), cat("status", 5)),
        max_length=4,
        children=(line,),
    )
    root = NodeDef("customer", (num("balance"), cat("segment", 7), cat("churn", 4)), children=(orders,))
    classes = 3 if kind == "category" else 1
    return ModelSchema(root, TargetDef(target_node, target_column, kind, classes))


SMALL = ModelConfig(d_model=16, layers=2, heads=2, dropout=0.0, ffn_mult=2)


@pytest.fixture
def make_schema():
    """Factory for ``nested_schema`` variants (fixtures, since tests are not a package)."""
    return nested_schema


@pytest.fixture
def small() -> ModelConfig:
    return SMALL


@pytest.fixture
def schema() -> ModelSchema:
    return nested_schema()


@pytest.fixture
def model(schema: ModelSchema) -> RelationalTransformer:
    torch.manual_seed(0)
    return RelationalTransformer(schema, SMALL).eval()
