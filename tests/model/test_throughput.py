"""Throughput callback, precision contexts and meta-device inspection.

Named after the main module under test, model/throughput.py; also model/precision.py and
model/meta.py, whose tests are a few lines each (tests/README.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from model import ModelConfig, ModelSchema, RelationalTransformer
from model.meta import inspect_on_meta
from model.precision import autocast_context
from model.synthetic import random_batch
from model.throughput import ThroughputCallback


class ListLogger:
    def __init__(self) -> None:
        self.records: list[tuple[dict, int]] = []

    def log(self, metrics: dict, step: int) -> None:
        self.records.append((metrics, step))


def test_throughput_estimate_is_batches_times_batch_size():
    logger = ListLogger()
    cb = ThroughputCallback(batch_size=100, key="compute.estimated_rows_per_s", logger=logger)
    cb.on_batch_end(1.0)
    cb.on_batch_end(1.0)  # a partial last batch (say 20 rows) still counts as 100
    metrics = cb.flush(step=3)
    assert metrics == {"compute.estimated_rows_per_s": 100.0}
    assert logger.records == [(metrics, 3)] and cb.metrics == metrics
    assert ThroughputCallback(batch_size=8, key="k").flush() == {"k": 0.0}  # no batches: no rate
    with pytest.raises(ValueError, match="batch_size"):
        ThroughputCallback(batch_size=0, key="k")


def test_precision_contexts(model):
    batch = random_batch(model.schema, 3)
    with autocast_context("cpu", "bf16"):
        out = model(batch, outputs=("prediction", "root_embedding"))
    assert all(torch.isfinite(v.float()).all() for v in out.values())
    with autocast_context("cpu", "fp32"):
        assert model(batch)["prediction"].dtype == torch.float32
    with pytest.raises(ValueError, match="fp16.*CUDA"):
        autocast_context("cpu", "fp16")
    with pytest.raises(ValueError, match="precision"):
        autocast_context("cpu", "fp64")


def test_meta_inspection_counts_without_allocating(schema):
    config = ModelConfig(d_model=16, layers=2, heads=2, ffn_mult=2)
    report = inspect_on_meta(schema, config)
    real = RelationalTransformer(schema, config)
    assert report["parameters"] == sum(p.numel() for p in real.parameters())
    # analytic lower bound: linear FLOPs of every reserved token in every layer
    D, tokens = 16, (3 + 1) + 4 * (3 + 1) + 4 * 3 * 3  # root + orders + lineitem tokens
    per_token_layer = 2 * (3 * D * D + D * D + 2 * D * 2 * D)
    assert report["flops_per_root_row"] >= tokens * per_token_layer * config.layers
    orders = schema.root.children[0]
    longer = ModelSchema(replace(schema.root, children=(replace(orders, max_length=8),)), schema.target)
    # twice the reserved orders (and lineitems) -> more than twice the attention work there
    assert inspect_on_meta(longer, config)["flops_per_root_row"] > 1.8 * report["flops_per_root_row"]
