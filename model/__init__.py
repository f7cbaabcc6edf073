"""relflow model: a nested-branch relational transformer in plain PyTorch.

Imports torch, numpy and pyarrow only (no Prefect, no MLflow). ``model.arrow`` (the Arrow
-> Batch encoder) is imported lazily by ``ArrowDataModule`` when no ``encode`` is given.
"""

from .batch import Batch, NodeTensors
from .checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from .config import ModelConfig
from .data import ArrowDataModule
from .meta import inspect_on_meta
from .optim import AdamW, adamw
from .precision import autocast_context
from .schema import ColumnDef, ModelSchema, NodeDef, TargetDef
from .throughput import ThroughputCallback
from .transformer import RelationalTransformer

__all__ = [
    "AdamW",
    "ArrowDataModule",
    "Batch",
    "Checkpoint",
    "ColumnDef",
    "ModelConfig",
    "ModelSchema",
    "NodeDef",
    "NodeTensors",
    "RelationalTransformer",
    "TargetDef",
    "ThroughputCallback",
    "adamw",
    "autocast_context",
    "inspect_on_meta",
    "load_checkpoint",
    "save_checkpoint",
]
