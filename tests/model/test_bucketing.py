"""Length bucketing (model side): plans never split a root, trimmed batches give the padded
batch's numbers at present rows, outputs go back to key order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model import ModelConfig, RelationalTransformer
from model.arrow import coordinate_counts
from model.bucketing import (
    output_node,
    pad_back,
    plan,
    restore_order,
    root_shapes,
    take,
)
from model.synthetic import random_batch


@pytest.fixture
def chunk(schema):
    # varied fill: some roots nearly empty, some full, so batches differ in length
    return random_batch(schema, 40, fill={"orders": 0.4, "lineitem": 0.5}, seed=3)


def test_root_shapes_count_present_cells_and_longest_instances(schema, chunk):
    shapes = root_shapes(chunk, schema)
    for i in (0, 7, 39):
        one = chunk.select(torch.tensor([i]))
        present, _ = coordinate_counts(one, schema)
        assert shapes.cells[i] == present
        for name in ("orders", "lineitem"):
            p = one.nodes[name].present
            assert shapes.lengths[name][i] == int(p.sum(-1).max())


@pytest.mark.parametrize("shuffle", [False, True])
def test_plan_never_splits_a_root_and_covers_every_row_once(schema, chunk, shuffle):
    shapes = root_shapes(chunk, schema)
    rows = torch.arange(3, 40)  # a subset, as training uses
    g = torch.Generator().manual_seed(0) if shuffle else None
    batches = plan(shapes, rows, batch_size=4, bucket_count=3, generator=g)
    ran = torch.cat([b.rows for b in batches])
    assert sorted(ran.tolist()) == rows.tolist()  # each root exactly once, whole
    assert all(b.rows.numel() <= 4 for b in batches)
    assert sum(b.rows.numel() < 4 for b in batches) <= 1
    if shuffle:
        assert batches[-1].rows.numel() == 4 or batches[-1].rows.numel() == len(rows) % 4
    for b in batches:  # padded to exactly its own longest instance per branch
        for name, L in b.lengths.items():
            longest = max(int(shapes.lengths[name][b.rows.numpy()].max()), 1)
            assert longest == L
    if not shuffle:  # grouped by size: cells never decrease from one batch to the next
        cells = [shapes.cells[b.rows.numpy()] for b in batches]
        assert all(a.max() <= b.min() for a, b in zip(cells, cells[1:], strict=False))


def test_plan_shuffle_follows_the_seed(schema, chunk):
    shapes = root_shapes(chunk, schema)
    rows = torch.arange(40)

    def order(seed):
        batches = plan(shapes, rows, 4, 3, torch.Generator().manual_seed(seed))
        return torch.cat([b.rows for b in batches]).tolist()

    assert order(1) == order(1)
    assert order(1) != order(2)
    assert order(1) != plan(shapes, rows, 4, 3)[0].rows.tolist()


def test_bucket_padding_bounds_the_shapes(schema, chunk):
    shapes = root_shapes(chunk, schema)
    batches = plan(shapes, torch.arange(40), 4, bucket_count=2, pad_to="bucket")
    assert len({tuple(b.lengths.values()) for b in batches}) <= 2
    assert len({b.bucket for b in batches}) == 2


@pytest.mark.parametrize("packing", ["off", "auto"])
def test_trimmed_batches_match_the_padded_batch_at_present_rows(schema, chunk, packing):
    torch.manual_seed(0)
    model = RelationalTransformer(schema, ModelConfig(d_model=16, layers=1, heads=2)).eval()
    model.packing = packing
    outputs = ("prediction", "root_embedding", "branch_embedding:lineitem", "leaf:lineitem")
    with torch.no_grad():
        full = model(chunk, outputs=outputs)
        batches = plan(root_shapes(chunk, schema), torch.arange(40), 8, 3)
        parts: dict[str, list[torch.Tensor]] = {k: [] for k in outputs}
        padded = trimmed = 0
        for b in batches:
            part = take(chunk, schema, b.rows, b.lengths)
            assert part.nodes["orders"].present.shape == (b.rows.numel(), b.lengths["orders"])
            trimmed += coordinate_counts(part, schema)[1]
            padded += coordinate_counts(chunk.select(b.rows), schema)[1]
            for k, v in model(part, outputs=outputs).items():
                parts[k].append(pad_back(v, schema, output_node(k, schema)))
    assert trimmed < padded
    ran = torch.cat([b.rows for b in batches])
    for k in outputs:
        got = restore_order(torch.cat(parts[k]), ran)
        node = output_node(k, schema)
        mask = torch.ones(40, dtype=torch.bool) if node is None or node == "customer" else chunk.nodes[node].present
        assert got.shape == full[k].shape
        torch.testing.assert_close(got[mask], full[k][mask], atol=1e-5, rtol=1e-4)


def test_restore_order_inverts_the_run_order():
    x = torch.arange(10.0)
    ran = torch.from_numpy(np.random.default_rng(0).permutation(10))
    assert restore_order(x[ran], ran).tolist() == x.tolist()
