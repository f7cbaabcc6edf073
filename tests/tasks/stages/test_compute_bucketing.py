"""Length bucketing through the compute stage: same predictions as ``off`` (same weights) in
the original key order, whole roots per batch, fewer materialised coordinates, bounded
shapes (and recompiles) when regions are compiled."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from model import bucketing
from tasks.libraries.reference.engine import Engine
from tasks.measure.records import batch_coordinate_metrics
from tasks.sources.files import resolve_sources
from tasks.spec import parse_spec
from tasks.stages.compute import compiled_frames
from tasks.stages.preprocess import preprocess
from tasks.stages.retrieve import list_root_keys, retrieve
from tasks.stages.tensorize import fit, tensorize


def varied_tables(n: int = 48, seed: int = 0) -> dict[str, pa.Table]:
    """Customers with 0..5 orders (a few with 5), orders with 1..3 lines: varied contexts."""
    rng = np.random.default_rng(seed)
    n_orders = rng.choice([0, 1, 1, 2, 5], size=n)
    cust = np.repeat(np.arange(1, n + 1), n_orders)
    o_id = np.arange(1, cust.size + 1)
    n_lines = rng.integers(1, 4, size=o_id.size)
    return {
        "customers": pa.table(
            {
                "c_id": pa.array(np.arange(1, n + 1), pa.int64()),
                "c_balance": rng.normal(size=n),
                "churn": pa.array(rng.choice(["yes", "no"], size=n)),
            }
        ),
        "orders": pa.table(
            {
                "o_id": pa.array(o_id, pa.int64()),
                "o_cust": pa.array(cust, pa.int64()),
                "o_total": rng.normal(size=o_id.size),
                "o_status": pa.array(rng.choice(["open", "done", None], size=o_id.size)),
            }
        ),
        "lines": pa.table(
            {
                "l_order": pa.array(np.repeat(o_id, n_lines), pa.int64()),
                "l_no": pa.array(np.concatenate([np.arange(k) for k in n_lines]), pa.int64()),
                "l_qty": rng.normal(size=int(n_lines.sum())),
            }
        ),
    }


def varied_spec() -> dict:
    return {
        "name": "varied",
        "source": {"tables": {t: f"{t}.parquet" for t in ("customers", "orders", "lines")}},
        "schema": {
            "root": {"table": "customers", "key": "c_id", "columns": {"c_balance": "numeric"}},
            "branches": [
                {
                    "name": "orders",
                    "table": "orders",
                    "parent_key": "o_cust",
                    "key": "o_id",
                    "order_by": {"column": "o_id"},
                    "max_length": 6,
                    "reduce": "attention",
                    "columns": {"o_total": "numeric", "o_status": "category"},
                    "branches": [
                        {
                            "name": "lines",
                            "table": "lines",
                            "parent_key": "l_order",
                            "order_by": {"column": "l_no"},
                            "max_length": 4,
                            "columns": {"l_qty": "numeric"},
                        }
                    ],
                }
            ],
        },
        "task": {
            "target": "churn",
            "kind": "category",
            "outputs": ["prediction", "root_embedding", "branch_embedding:lines", "leaf:lines"],
        },
        "model": {"d_model": 8, "layers": 1, "heads": 2},
        "run": {
            "batch_size": 8,
            "epochs": 1,
            "warmup_batches": 0,
            "device": "cpu",
            "packing": "off",
            "bucket_count": 3,
        },
    }


@pytest.fixture
def varied(tmp_path: Path, write_tables) -> Path:
    return write_tables(varied_tables(), folder=tmp_path / "varied")


def run_predict(spec_dict: dict, folder: Path, **run):
    d = copy.deepcopy(spec_dict)
    d["run"].update(run)
    spec = parse_spec(d)
    sources = resolve_sources(spec, folder)
    keys, _ = list_root_keys(spec, sources)
    pre = preprocess(spec, retrieve(spec, sources, keys))
    enc, schema = fit(spec, pre)
    tz = tensorize(spec, pre, enc, schema)
    engine = Engine(spec, schema, torch.device("cpu"), None, encoding=enc)
    return engine, tz, engine.predict(tz, tuple(spec.task.outputs))


def present_mask(out, name: str, engine: Engine) -> torch.Tensor:
    node = bucketing.output_node(name, engine.schema)
    if node is None or node == engine.schema.root.name:
        return torch.ones(out.tensors[name].shape[0], dtype=torch.bool)
    return out.present[node]


@pytest.mark.slow
@pytest.mark.parametrize("packing", ["off", "auto"])
@pytest.mark.parametrize("workers", [0, 1])
def test_bucketing_keeps_predictions_and_key_order(varied, packing, workers):
    off_engine, off_tz, off = run_predict(varied_spec(), varied, packing=packing, loader={"num_workers": workers})
    on_engine, on_tz, on = run_predict(
        varied_spec(), varied, packing=packing, bucketing="by_length", loader={"num_workers": workers}
    )
    assert on_tz.keys.equals(off_tz.keys)  # outputs align with the same keys, in key order
    for name in off.tensors:
        assert on.tensors[name].shape == off.tensors[name].shape
        mask = present_mask(off, name, off_engine)
        torch.testing.assert_close(on.tensors[name][mask], off.tensors[name][mask], atol=1e-5, rtol=1e-4)
    for node, p in off.present.items():
        assert torch.equal(on.present[node], p)
    assert on_engine.quality.metrics() == pytest.approx(off_engine.quality.metrics(), abs=1e-9)
    off_m = batch_coordinate_metrics(off_engine.batch_coords, 1, len(off_engine.batch_shapes))
    on_m = batch_coordinate_metrics(on_engine.batch_coords, 1, len(on_engine.batch_shapes))
    assert off_m["data.padded_coords"] == off_tz.coords_reserved  # off: the schema product
    assert on_m["data.padded_coords"] < off_m["data.padded_coords"]
    assert on_m["data.batch_occupancy.min"] >= off_m["data.batch_occupancy.min"]
    assert sum(p for p, _ in on_engine.batch_coords) == on_tz.coords_present  # every cell once


@pytest.mark.slow
def test_training_batches_hold_whole_roots_and_follow_the_seed(varied):
    def trained(seed: int):
        d = varied_spec()
        d["run"].update(bucketing="by_length", seed=seed)
        spec = parse_spec(d)
        sources = resolve_sources(spec, varied)
        keys, _ = list_root_keys(spec, sources)
        pre = preprocess(spec, retrieve(spec, sources, keys))
        enc, schema = fit(spec, pre)
        tz = tensorize(spec, pre, enc, schema)
        engine = Engine(spec, schema, torch.device("cpu"), None, encoding=enc)
        engine.train(tz)
        return engine, tz

    engine, tz = trained(0)
    ran = torch.cat(engine._ran_rows)
    train_rows = torch.nonzero(tz.is_train).flatten()
    assert sorted(ran.tolist()) == train_rows.tolist()  # every training root once, whole
    assert engine.train_timings.updates == -(-train_rows.numel() // 8)
    again, _ = trained(0)
    other, _ = trained(1)
    assert torch.equal(torch.cat(again._ran_rows), ran)
    assert not torch.equal(torch.cat(other._ran_rows), ran)
    assert not torch.equal(ran, ran.sort().values)  # not in key order


@pytest.mark.slow
def test_compiled_bucketing_bounds_shapes_and_recompiles(varied):
    """Compiled regions pad to the bucket's longest context: at most bucket_count shapes, and
    a second predict pass over the same chunk compiles nothing new."""
    torch._dynamo.reset()
    engine, tz, _ = run_predict(
        varied_spec(), varied, bucketing="by_length", bucket_count=2, compile={"encoders": True, "pools": True}
    )
    assert 1 <= len(engine.batch_shapes) <= 2
    after_first = compiled_frames()
    engine.predict(tz, ("prediction",))
    assert compiled_frames() == after_first  # recompiles after the first pass: 0
