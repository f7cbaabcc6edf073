"""Every library scores the same held-out rows (issue 43 item 9): a held-out category label
whose class the model never learned is scored as a wrong prediction, never dropped.

The libraries learn their classes from different chunks: the reference model's encoding and
relational-transformers' statistics come from the first chunk's training rows, relflow's
vocabulary grows with every training chunk it encodes. Real chain, real libraries, the shop
tables in two chunks (no Prefect); the models are tiny.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import pyarrow as pa
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Chunks of 4 root rows: [1, 2, 3, 4] and [5]. validation_fraction 0.4 holds out customers 1
# and 4 (the stable key hash), so the training rows are 2 and 3 (first chunk) and 5 (second).
CHURN = {1: "maybe", 2: "no", 3: "yes", 4: "other", 5: "maybe"}
HELD_OUT = (1, 4)
# 'other' is in no training row; 'maybe' is only in the second chunk's: relflow learns it,
# the reference model, relational-transformers and LightGBM (classes from the first chunk) never do
UNSEEN = {"reference": 2, "relflow": 1, "relational_transformers": 2, "lightgbm": 2}


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(before)


def _spec(shop_spec: dict[str, Any], library: str) -> dict[str, Any]:
    spec = copy.deepcopy(shop_spec)
    spec["model"] = {"library": library, "d_model": 8, "layers": 2 if library != "relflow" else 1, "heads": 2}
    spec["run"] |= {"system_metrics_interval_s": 0, "chunk_rows": 4, "batch_size": 2}
    spec["task"]["validation_fraction"] = 0.4
    return spec


@pytest.mark.parametrize("library", list(UNSEEN))
def test_a_held_out_class_never_learned_is_scored_wrong_not_dropped(library, shop_spec, shop_tables, write_tables):
    from tasks.run.chain import Chain
    from tasks.run.scenarios.workload import Workload
    from tasks.sources.files import resolve_sources
    from tasks.spec import parse_spec

    c = shop_tables["customers"]
    churn = pa.array([CHURN[k] for k in c["c_id"].to_pylist()], pa.string())
    folder = write_tables(dict(shop_tables, customers=c.set_column(c.schema.get_field_index("churn"), "churn", churn)))
    spec = parse_spec(_spec(shop_spec, library))
    chain = Chain(spec, resolve_sources(spec, folder), torch.device("cpu"))
    work = Workload(chain)
    work.list_keys()
    assert [list(k) for k in work.chunks] == [[1, 2, 3, 4], [5]]
    work.train()
    engine = chain.engine
    assert engine is not None
    predicted: dict[int, str] = {}
    for i in range(len(work.chunks)):
        tz = work.prepare(i, "predict")
        assert tz.is_scored.tolist() == [k in HELD_OUT for k in work.chunks[i]]
        table = engine.predictions_table(tz.keys, engine.predict(tz, ("prediction",)))
        predicted |= dict(zip(table["c_id"].to_pylist(), table["prediction"].to_pylist(), strict=True))
    m = engine.quality.metrics()
    # both held-out rows scored, whatever classes this library learned, and from which chunk
    assert m["rows"] == len(HELD_OUT)
    assert m["unseen_class_rows"] == UNSEEN[library]
    # a class the model cannot name is never predicted: the row counts as a miss
    assert m["accuracy"] == sum(predicted[k] == CHURN[k] for k in HELD_OUT) / len(HELD_OUT)
    if UNSEEN[library] == len(HELD_OUT):
        assert m["accuracy"] == 0.0 and m["majority_rate"] == 0.0  # no held-out row of a learned class
