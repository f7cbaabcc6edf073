"""Output selection end to end through the real model: only selected outputs are computed
and written, branch outputs hold present rows only, and a larger selection costs bytes.

Named ``test_write_outputs.py`` (tests/README.md): test_write.py holds the write stage's own tests;
this file is one aspect (output selection through the real model)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import torch

from tasks.libraries.reference.engine import Engine
from tasks.stages.write import PredictionWriter, to_table

ALL = ["prediction", "topk:2", "root_embedding", "branch_embedding:lines", "leaf:orders"]


def _predict(prepare_chunk, spec_dict, folder: Path, outputs: list[str]):
    spec_dict["task"] = {"target": "o_status", "branch": "orders", "kind": "category", "outputs": outputs}
    spec, enc, schema, tz = prepare_chunk(spec_dict, folder)
    engine = Engine(spec, schema, torch.device("cpu"))
    calls = []
    real_forward = engine.model.forward

    def spy(batch, outputs=("prediction",)):
        calls.append(tuple(outputs))
        return real_forward(batch, outputs=outputs)

    engine.model.forward = spy
    outs = engine.predict(tz, tuple(spec.task.outputs))
    return spec, enc, schema, tz, outs, calls


def test_only_selected_outputs_are_computed_and_written(prepare_chunk, shop_files, shop_spec, tmp_path):
    spec, enc, schema, tz, outs, calls = _predict(prepare_chunk, shop_spec, shop_files, ["prediction"])
    assert set(outs.tensors) == {"prediction"}
    assert all(c == ("prediction",) for c in calls)
    table = to_table(spec, schema, enc, tz.keys, outs)
    assert table.column_names == ["c_id", "prediction"]


def test_every_output_kind_and_its_payload(prepare_chunk, shop_files, shop_spec, tmp_path):
    spec, enc, schema, tz, outs, _ = _predict(prepare_chunk, shop_spec, shop_files, ALL)
    table = to_table(spec, schema, enc, tz.keys, outs)
    assert table.column_names == [
        "c_id",
        "prediction",
        "top2_labels",
        "top2_scores",
        "root_embedding",
        "branch_embedding_lines",
        "leaf_orders",
    ]
    orders_present = tz.batch.nodes["orders"].present.sum(-1).tolist()
    # leaf target: one prediction per present order, per customer
    assert [len(v) for v in table["prediction"].to_pylist()] == orders_present
    assert [len(v) for v in table["leaf_orders"].to_pylist()] == orders_present
    assert [len(v) for v in table["branch_embedding_lines"].to_pylist()] == orders_present
    assert all(len(e) == spec.model.d_model for e in table["root_embedding"].to_pylist())
    for labels, scores in zip(table["top2_labels"].to_pylist(), table["top2_scores"].to_pylist(), strict=True):
        for lab, sc in zip(labels, scores, strict=True):
            assert len(lab) == 2 and sc[0] >= sc[1]
            assert set(lab) <= set(enc.classes)

    # A larger selection costs more bytes in the prediction file.
    def written(columns: list[str]) -> int:
        w = PredictionWriter(tmp_path / f"{len(columns)}.parquet")
        w.write(table.select(columns))
        return w.commit()

    assert written(["c_id", "prediction"]) < written(table.column_names)
    assert pq.read_table(tmp_path / f"{len(table.column_names)}.parquet").num_rows == tz.root_rows
