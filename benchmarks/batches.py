"""Real batches of a benchmark spec, built by the harness's own stage functions.

Shared by the micro-benchmarks that time the model outside the harness (threads,
cross-check): the same retrieve -> preprocess -> tensorize code the flow runs, every root row
in key order, sliced into ``run.batch_size`` batches exactly as the compute stage slices them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from model import ModelConfig, RelationalTransformer
from tasks.sources.files import resolve_sources
from tasks.sources.tpch import ensure_tpch
from tasks.spec import Spec, load_spec
from tasks.stages.preprocess import preprocess
from tasks.stages.retrieve import list_root_keys, retrieve
from tasks.stages.tensorize import fit, tensorize


def load(spec_path: Path, overrides: list[str] | None = None):
    """(spec, schema, batches) with every root row, in the compute stage's order."""
    spec, schema, _, tz = load_chunk(spec_path, overrides)
    batch = tz.batch
    parts = [batch.select(idx) for idx in torch.arange(batch.size).split(spec.run.batch_size)]
    return spec, schema, parts


def build_model(spec: Spec, schema) -> RelationalTransformer:
    """The model the harness's Engine builds for ``spec`` (same seed, packing, eval mode)."""
    torch.manual_seed(spec.run.seed)
    m = spec.model
    model = RelationalTransformer(
        schema, ModelConfig(d_model=m.d_model, layers=m.layers, heads=m.heads, dropout=m.dropout)
    )
    model.packing = spec.run.packing
    return model.eval()


def load_chunk(spec_path: Path, overrides: list[str] | None = None):
    """(spec, schema, encoding, Tensorized) of every root row: what the compute stage gets."""
    spec: Spec = load_spec(spec_path, overrides or [])
    base = spec_path.resolve().parent
    if spec.source.generate is not None:
        base, _ = ensure_tpch(spec.source.generate.tpch.scale)
    sources = resolve_sources(spec, base)
    keys, _ = list_root_keys(spec, sources)
    pre = preprocess(spec, retrieve(spec, sources, keys))
    enc, schema = fit(spec, pre)
    return spec, schema, enc, tensorize(spec, pre, enc, schema)
