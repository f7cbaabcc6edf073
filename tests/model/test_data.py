"""ArrowDataModule: Arrow stays on CPU, batches are encoded per slice, workers are disjoint."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from model import Batch, NodeTensors
from model.data import ArrowBatches, ArrowDataModule


def encode_ids(table: pa.Table) -> Batch:
    ids = torch.tensor(table.column("id").to_numpy(), dtype=torch.float32)
    n = len(ids)
    node = NodeTensors(
        present=torch.ones(n, dtype=torch.bool),
        continuous=ids.unsqueeze(1),
        continuous_null=torch.zeros(n, 1, dtype=torch.bool),
        categorical=torch.zeros(n, 0, dtype=torch.long),
    )
    return Batch({"customer": node}, ids, torch.ones(n, dtype=torch.bool))


def ids_of(loader) -> list[list[int]]:
    return [b.nodes["customer"].continuous[:, 0].long().tolist() for b in loader]


def test_worker_ranges_are_disjoint_and_cover_the_table():
    table = pa.table({"id": list(range(10))})
    data = ArrowBatches(table, 3, encode_ids)
    assert len(data) == 4
    assert data.ranges(0, 2) == [(0, 3), (6, 3)]
    assert data.ranges(1, 2) == [(3, 3), (9, 1)]
    all_rows = sorted(r for w in range(3) for o, n in data.ranges(w, 3) for r in range(o, o + n))
    assert all_rows == list(range(10))


def test_batches_in_process(model):
    table = pa.table({"id": list(range(7))})
    dm = ArrowDataModule(model=model, train=table, validate=table, batch_size=3, encode=encode_ids)
    assert ids_of(dm.train_dataloader()) == [[0, 1, 2], [3, 4, 5], [6]]
    assert len(dm.val_dataloader()) == 3
    batch = next(iter(dm.val_dataloader()))
    assert batch.nodes["customer"].continuous.device == model.device
    assert dm.train_dataloader() is dm.train_dataloader()  # reused: persistent workers persist


def test_settings_that_cannot_apply_warn_and_missing_encoder_errors(model):
    table = pa.table({"id": [1]})
    with pytest.warns(UserWarning, match="pin_memory"):
        ArrowDataModule(model=model, train=table, batch_size=2, pin_memory=True, encode=encode_ids)
    with pytest.warns(UserWarning, match="persistent_workers"):
        ArrowDataModule(model=model, train=table, batch_size=2, persistent_workers=True, encode=encode_ids)
    with pytest.raises(ValueError, match="encode="):
        ArrowDataModule(model=model, train=table, batch_size=2)
    with pytest.raises(ValueError, match="no validate table"):
        ArrowDataModule(model=model, train=table, batch_size=2, encode=encode_ids).val_dataloader()
    model.batch_size = 5
    assert ArrowDataModule(model=model, train=table, encode=encode_ids).batch_size == 5


def test_two_workers_take_disjoint_slices_in_order(model):
    table = pa.table({"id": list(range(11))})
    dm = ArrowDataModule(
        model=model,
        train=table,
        batch_size=2,
        num_workers=2,
        persistent_workers=True,
        prefetch_factor=2,
        encode=encode_ids,
    )
    for _ in range(2):  # two epochs through persistent workers
        batches = ids_of(dm.train_dataloader())
        assert batches == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10]]
