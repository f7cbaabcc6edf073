"""relflow model: a nested-branch relational transformer in plain PyTorch.

Imports torch, numpy and pyarrow only (no Prefect, no MLflow).
"""

from .batch import Batch, NodeTensors
from .config import ModelConfig
from .optim import AdamW, adamw
from .schema import ColumnDef, ModelSchema, NodeDef, TargetDef
from .transformer import RelationalTransformer

__all__ = [
    "AdamW",
    "Batch",
    "ColumnDef",
    "ModelConfig",
    "ModelSchema",
    "NodeDef",
    "NodeTensors",
    "RelationalTransformer",
    "TargetDef",
    "adamw",
]
