"""Real batches of a benchmark spec, built by the harness's own stage functions.

Shared by the micro-benchmarks that time the model outside the harness (threads,
cross-check): the harness's own stage chain (tasks/run/chain.py), untimed, every root row
in key order, sliced into ``run.batch_size`` batches exactly as the compute stage slices them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from model import ModelConfig, RelationalTransformer
from tasks.run.chain import Chain
from tasks.sources.open import open_sources
from tasks.spec import Spec, load_spec
from tasks.stages.retrieve import list_root_keys


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


def prepared(spec: Spec, spec_dir: Path, roots: int | None = None):
    """(spec, schema, encoding, Tensorized) of the first ``roots`` root rows (every one by
    default), through the harness's chain, untimed: what the compute stage gets."""
    chain = Chain(spec, open_sources(spec, spec_dir), torch.device("cpu"))
    keys, _ = list_root_keys(spec, chain.sources)
    tz = chain.prepare_untimed(keys[:roots])
    assert chain.schema is not None and chain.encoding is not None  # fitted on these rows
    return spec, chain.schema, chain.encoding, tz


def load_chunk(spec_path: Path, overrides: list[str] | None = None):
    """(spec, schema, encoding, Tensorized) of every root row of the spec file."""
    return prepared(load_spec(spec_path, overrides or []), spec_path.resolve().parent)
