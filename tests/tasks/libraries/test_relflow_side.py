"""relflow inside the harness's chain (tasks/libraries/relflow/side.py): the rows each stage
row reports, and relflow's own throughput-logger figures beside the harness's exact ones.

Real relflow, real chain over the shop tables (no Prefect); the model is tiny.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

lightning = pytest.importorskip("lightning.pytorch")


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(before)


def relflow_spec(shop_spec: dict[str, Any], **run: Any) -> dict[str, Any]:
    spec = copy.deepcopy(shop_spec)
    spec["model"] = {"library": "relflow", "d_model": 8, "layers": 1, "heads": 2}
    spec["run"] |= {"system_metrics_interval_s": 0, **run}
    spec["task"]["validation_fraction"] = 0.4  # customers 1 and 4 held out (the stable key hash)
    return spec


def _chain(spec_dict: dict[str, Any], folder: Any) -> Any:
    from tasks.sources.files import resolve_sources
    from tasks.spec import parse_spec
    from tasks.stages.chain import Chain

    spec = parse_spec(spec_dict)
    return Chain(spec, resolve_sources(spec, folder), torch.device("cpu"))


def test_train_tensorize_reports_the_rows_it_encoded_not_the_chunk(shop_spec, shop_files) -> None:
    from tasks.stages.retrieve import list_root_keys

    chain = _chain(relflow_spec(shop_spec), shop_files)
    keys, _ = list_root_keys(chain.spec, chain.sources)
    book: dict[str, dict[str, int]] = {"train": {}, "predict": {}}
    for phase in ("train", "predict"):
        p = chain.prepare(keys, lambda stage, s, rows, ph=phase: book[ph].__setitem__(stage, rows), {"phase": phase})
        training_rows = int(p.tz.is_train.sum())  # the harness's split, not the library's count
    assert 0 < training_rows < len(keys) == 5
    # retrieve and preprocess read and nest every row of the chunk in both phases; a training
    # tensorize encodes the training rows alone (strata=train), a predict one every row
    assert book["train"] == {"retrieve": 5, "preprocess": 5, "tensorize": training_rows}
    assert book["predict"] == {"retrieve": 5, "preprocess": 5, "tensorize": 5}
