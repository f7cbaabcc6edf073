"""run.loader: with workers, ArrowDataModule encodes batch by batch from Arrow and gives the
same batches, predictions and coordinate counts as the in-process path.

Named ``test_compute_loader_mode.py`` (tests/README.md): test_compute.py holds the compute stage's
own tests; this file is one aspect (run.loader)."""

from __future__ import annotations

import copy

import pytest
import torch

from tasks.libraries.reference.engine import Engine


def _engine(prepare_chunk, spec_dict, folder, workers: int):
    d = copy.deepcopy(spec_dict)
    d["run"]["loader"] = {"num_workers": workers}
    spec, enc, schema, tz = prepare_chunk(d, folder)
    return Engine(spec, schema, torch.device("cpu"), encoding=enc), tz


@pytest.mark.parametrize("workers", [1, 2])
def test_loader_workers_match_the_in_process_path(prepare_chunk, shop_files, shop_spec, workers):
    base, tz0 = _engine(prepare_chunk, shop_spec, shop_files, 0)
    loader, tz1 = _engine(prepare_chunk, shop_spec, shop_files, workers)
    assert tz0.batch is not None and tz1.batch is None and tz1.table is not None
    assert (tz1.coords_present, tz1.coords_reserved) == (tz0.coords_present, tz0.coords_reserved)
    loader.model.load_state_dict(base.model.state_dict())
    out0 = base.predict(tz0, ("prediction", "root_embedding"))
    out1 = loader.predict(tz1, ("prediction", "root_embedding"))
    for k in out0.tensors:
        torch.testing.assert_close(out1.tensors[k], out0.tensors[k], atol=1e-5, rtol=1e-5)
    for k in out0.present:
        assert torch.equal(out1.present[k], out0.present[k])
    assert loader.quality.metrics() == base.quality.metrics()
    counts = [(len(t.warmup_seconds), t.steady_rows) for t in (loader.predict_timings, base.predict_timings)]
    assert counts[0] == counts[1]
    # training goes through the loader too, over the same shuffled rows
    loader.train(tz1)
    assert loader.train_timings.updates == -(-int(tz1.is_train.sum()) // loader.spec.run.batch_size)
