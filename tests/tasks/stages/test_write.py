"""write (tasks/stages/write.py) without Prefect.

The hand-made shop workload (tables in tests/conftest.py):
customers (root) -> orders (max_length 2, by o_date) -> lines (max_length 3, by l_no):
customer 1 has 3 orders (10, 11, 12), customer 3 none; order 10 has 4 lines, order 12 two.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tasks.spec import Spec
from tasks.stages.compute import PredictOutputs
from tasks.stages.preprocess import preprocess
from tasks.stages.tensorize import fit, tensorize
from tasks.stages.write import PredictionWriter, to_table
from tests.tasks.stages.conftest import orders_branch, retrieved_of, spec_of

# --- write -------------------------------------------------------------------------------


def branch_target_spec(shop_spec: dict) -> Spec:
    raw = copy.deepcopy(shop_spec)
    del orders_branch(raw)["columns"]["o_status"]
    raw["task"] = {
        "target": "o_status",
        "branch": "orders",
        "kind": "category",
        "outputs": ["prediction", "leaf:lines", "topk:2", "branch_embedding:lines"],
    }
    return spec_of(raw)


def test_nested_outputs_hold_only_present_rows(shop_spec, shop_tables):
    spec = branch_target_spec(shop_spec)
    pre = preprocess(spec, retrieved_of(shop_tables))
    enc, schema = fit(spec, pre)
    assert enc.classes == ["done", "new", "open"]
    tz = tensorize(spec, pre, enc, schema)
    gen = torch.Generator().manual_seed(0)
    present = {k: v.present for k, v in tz.batch.nodes.items()}
    logits = torch.randn(5, 2, 3, generator=gen)
    leaf = torch.randn(5, 2, 3, 4, generator=gen)
    pooled = torch.randn(5, 2, 4, generator=gen)
    outs = PredictOutputs({"prediction": logits, "leaf:lines": leaf, "branch_embedding:lines": pooled}, present)
    table = to_table(spec, schema, enc, tz.keys, outs)
    assert table.column_names == [
        "c_id",
        "prediction",
        "leaf_lines",
        "top2_labels",
        "top2_scores",
        "branch_embedding_lines",
    ]
    assert table["c_id"].to_pylist() == [1, 2, 3, 4, 5]
    orders_p, lines_p = present["orders"], present["lines"]

    expected_pred, expected_leaf, expected_emb = [], [], []
    for b in range(5):
        preds, leaves, embs = [], [], []
        for o in range(2):
            if not orders_p[b, o]:
                continue
            preds.append(enc.classes[int(logits[b, o].argmax())])
            embs.append(pytest.approx(pooled[b, o].tolist()))
            leaves.append([pytest.approx(leaf[b, o, s].tolist()) for s in range(3) if lines_p[b, o, s]])
        expected_pred.append(preds)
        expected_leaf.append(leaves)
        expected_emb.append(embs)
    assert table["prediction"].to_pylist() == expected_pred
    assert table["leaf_lines"].to_pylist() == expected_leaf
    assert table["branch_embedding_lines"].to_pylist() == expected_emb
    assert [len(x) for x in table["prediction"].to_pylist()] == [2, 1, 0, 2, 1]
    assert [[len(o) for o in r] for r in table["leaf_lines"].to_pylist()] == [[3, 1], [1], [], [2, 0], [0]]
    top = table["top2_labels"].to_pylist()
    assert [[t[0] for t in r] for r in top] == expected_pred  # best label first
    scores = table["top2_scores"].to_pylist()
    assert all(s[0] >= s[1] for r in scores for s in r)


def test_root_outputs_are_flat(shop_spec, pre):
    shop_spec["task"]["outputs"] = ["prediction", "root_embedding"]
    spec = spec_of(shop_spec)
    enc, schema = fit(spec, pre)
    tz = tensorize(spec, pre, enc, schema)
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 3.0], [5.0, 4.0], [0.0, 0.5]])
    emb = torch.arange(15, dtype=torch.float32).reshape(5, 3)
    outs = PredictOutputs(
        {"prediction": logits, "root_embedding": emb}, {k: v.present for k, v in tz.batch.nodes.items()}
    )
    table = to_table(spec, schema, enc, tz.keys, outs)
    assert table["prediction"].to_pylist() == ["no", "yes", "yes", "no", "yes"]
    assert table["root_embedding"].to_pylist() == emb.tolist()


def test_regression_predictions_are_unscaled(shop_spec, shop_tables):
    tables = dict(shop_tables)
    tables["customers"] = tables["customers"].append_column("spend", pa.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    shop_spec["task"] = {"target": "spend", "kind": "regression"}
    spec = spec_of(shop_spec)
    pre = preprocess(spec, retrieved_of(tables))
    enc, schema = fit(spec, pre)
    tz = tensorize(spec, pre, enc, schema)
    outs = PredictOutputs({"prediction": tz.batch.labels.clone()}, {k: v.present for k, v in tz.batch.nodes.items()})
    table = to_table(spec, schema, enc, tz.keys, outs)
    assert table["prediction"].to_pylist() == pytest.approx([1.0, 2.0, 3.0, 4.0, 5.0])


def test_binary_probabilities_keep_the_order_of_logits_near_zero(shop_spec, shop_tables):
    """A large fitted temperature leaves calibrated logits within 1e-7 of 0, where float32
    sigmoids tie: the written file would lose the ranking (its AUC below quality.auc)."""
    tables = dict(shop_tables)
    tables["customers"] = tables["customers"].append_column("vip", pa.array([True, False, True, False, True]))
    shop_spec["task"] = {"target": "vip", "kind": "binary"}
    spec = spec_of(shop_spec)
    pre = preprocess(spec, retrieved_of(tables))
    enc, schema = fit(spec, pre)
    tz = tensorize(spec, pre, enc, schema)
    logits = torch.tensor([1e-8, 2e-8, 3e-8, 4e-8, 5e-8])
    outs = PredictOutputs({"prediction": logits}, {k: v.present for k, v in tz.batch.nodes.items()})
    probs = to_table(spec, schema, enc, tz.keys, outs)["prediction"].to_pylist()
    assert probs == sorted(probs) and len(set(probs)) == 5


def test_multi_dimensional_outputs_keep_their_shape():
    from tasks.stages.write import nest

    for shape in [(4,), (4, 3), (4, 3, 2), (4, 3, 2, 2)]:
        values = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        assert nest(values, []).to_pylist() == values.tolist()
    # [B=2, L=2] presence, 3 present rows with a [2, 2] output each
    mask = np.array([[True, True], [True, False]])
    values = np.arange(3 * 4, dtype=np.float32).reshape(3, 2, 2)
    assert nest(values, [mask]).to_pylist() == [values[:2].tolist(), values[2:].tolist()]


def test_writer_commits_atomically(tmp_path: Path):
    path = tmp_path / "out" / "preds.parquet"
    writer = PredictionWriter(path)
    writer.write(pa.table({"k": [1, 2], "prediction": ["a", "b"]}))
    assert not path.exists() and writer.tmp.exists()  # only the temp file so far
    writer.write(pa.table({"k": [3], "prediction": ["c"]}))
    size = writer.commit()
    assert size == path.stat().st_size > 0
    assert pq.read_table(path).to_pydict() == {"k": [1, 2, 3], "prediction": ["a", "b", "c"]}
    assert sorted(p.name for p in path.parent.iterdir()) == ["preds.parquet"]
    assert writer.rows == 3


def test_writer_abort_leaves_nothing(tmp_path: Path):
    path = tmp_path / "out" / "preds.parquet"
    writer = PredictionWriter(path)
    writer.write(pa.table({"k": [1, 2]}))
    writer.abort()
    assert not path.exists()
    assert list(path.parent.iterdir()) == []
    writer.abort()  # idempotent
    PredictionWriter(tmp_path / "never" / "p.parquet").abort()  # nothing written: no error
    with pytest.raises(RuntimeError):
        PredictionWriter(tmp_path / "empty.parquet").commit()
