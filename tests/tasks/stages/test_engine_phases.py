"""The compute engine's per-phase accounting and the settings it must not ignore.

Built on a generated customers -> orders workload (n root rows, one chunk) run through
the real preprocess / fit / tensorize stages, so the engine sees real batches:
- recompiles are charged to the phase whose steady batch triggered them (Dynamo's "eager"
  backend: real frame compilation and guards, no code generation);
- regression quality is in the target's own units; quality rows are one pass's;
- train+predict with run.checkpoint resumes the optimizer (or refuses other settings);
- compile mode/options and AdamW fused/weight_decay reach the model.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

from tasks.backends.checkpoint import load_run_checkpoint, save_run_checkpoint
from tasks.libraries.reference.engine import Engine
from tasks.measure.clock import Clock
from tasks.runtime.errors import UserError
from tasks.spec import parse_spec
from tasks.stages.preprocess import FIT, SCORED, TRAIN, preprocess
from tasks.stages.retrieve import ROOT, Retrieved
from tasks.stages.tensorize import Tensorized, fit, tensorize


def spec_raw(**run) -> dict:
    return {
        "name": "gen",
        "source": {"tables": {"customers": "c.parquet", "orders": "o.parquet"}},
        "schema": {
            "root": {"table": "customers", "key": "c_id", "columns": {"c_balance": "numeric", "c_segment": "category"}},
            "branches": [
                {
                    "name": "orders",
                    "table": "orders",
                    "parent_key": "o_cust",
                    "order_by": {"column": "o_date"},
                    "max_length": 2,
                    "columns": {"o_total": "numeric"},
                }
            ],
        },
        "task": {"target": "churn", "kind": "category"},
        "model": {"d_model": 8, "layers": 1, "heads": 2},
        "run": {"batch_size": 4, "epochs": 1, "warmup_batches": 1, "device": "cpu", "packing": "off", **run},
    }


def tables(n: int, target_scale: float = 1.0) -> dict[str, pa.Table]:
    ids = list(range(1, n + 1))
    customers = pa.table(
        {
            "c_id": pa.array(ids, pa.int64()),
            "c_balance": pa.array([float(i % 7) for i in ids]),
            "c_segment": pa.array(["abc"[i % 3] for i in ids]),
            "churn": pa.array(["yes" if i % 2 else "no" for i in ids]),
            "spend": pa.array([target_scale * (1000 + 37 * (i % 11)) for i in ids]),
        }
    )
    orders = pa.table(
        {
            "o_cust": pa.array([i for i in ids for _ in range(2)], pa.int64()),
            "o_date": pa.array([dt.datetime(2024, 1, 1 + k) for _ in ids for k in range(2)]),
            "o_total": pa.array([float(i + k) for i in ids for k in range(2)]),
        }
    )
    return {"customers": customers, "orders": orders}


def chunk(spec, n: int, train_rows: int, target_scale: float = 1.0, enc=None, schema=None):
    """One chunk of ``n`` root rows, the first ``train_rows`` of them training rows."""
    t = tables(n, target_scale)
    pre = preprocess(spec, Retrieved({ROOT: t["customers"], "orders": t["orders"]}, 0, n))
    train = pa.array([i < train_rows for i in range(n)], pa.bool_())
    held = pc.invert(train)  # the rest are held out: scored, and fit where the key hash says so
    roles = {TRAIN: train, SCORED: held, FIT: pc.and_(held, pre.table[FIT].combine_chunks())}
    table = pre.table
    for name, column in roles.items():
        table = table.set_column(table.schema.get_field_index(name), name, column)
    pre = dataclasses.replace(pre, table=table)
    if enc is None:
        enc, schema = fit(spec, pre)
    return tensorize(spec, pre, enc, schema), enc, schema


def engine_for(spec, tz: Tensorized, enc, schema, **kw) -> Engine:
    return Engine(spec, schema, torch.device("cpu"), kw.pop("state", None), Clock("cpu"), enc, **kw)


# --- recompile windows ----------------------------------------------------------------

COMPILED = {"compile": {"encoders": True, "pools": False, "backend": "eager", "dynamic": False}}


@pytest.mark.slow
def test_a_recompile_in_predict_is_charged_to_predict_not_train():
    torch._dynamo.reset()
    spec = parse_spec(spec_raw(**COMPILED))
    # train: 8 rows = batches 4, 4 (one shape); predict: 10 rows = 4, 4, 2: the partial last
    # batch arrives after predict's warm-up and forces a recompile (static shapes).
    tz, enc, schema = chunk(spec, 10, train_rows=8)
    eng = engine_for(spec, tz, enc, schema)
    eng.train(tz)
    eng.train(tz)  # a second epoch: steady batches, same shape, no recompile
    eng.predict(tz, ("prediction",))
    assert eng.recompiles("predict") >= 1
    assert eng.recompiles("train") == 0


@pytest.mark.slow
def test_a_recompile_in_train_is_charged_to_train_not_predict():
    torch._dynamo.reset()
    spec = parse_spec(spec_raw(**COMPILED))
    # train: 10 rows = 4, 4, 2 (the partial batch recompiles in train's steady window);
    # predict: 12 rows = 4, 4, 4, one shape (its first call compiles, before steady state).
    tz, enc, schema = chunk(spec, 12, train_rows=10)
    eng = engine_for(spec, tz, enc, schema)
    eng.train(tz)
    eng.predict(tz, ("prediction",))
    eng.predict(tz, ("prediction",))
    assert eng.recompiles("train") >= 1
    assert eng.recompiles("predict") == 0


# --- quality ---------------------------------------------------------------------------


def test_regression_quality_is_in_the_targets_units():
    raw = spec_raw(epochs=1)
    raw["task"] = {"target": "spend", "kind": "regression"}
    spec = parse_spec(raw)
    figures = []
    for scale in (1.0, 1000.0):  # the same data in other units: errors scale with it
        tz, enc, schema = chunk(spec, 12, train_rows=8, target_scale=scale)
        eng = engine_for(spec, tz, enc, schema)
        eng.predict(tz, ("prediction",))
        figures.append(eng.quality.metrics())
    small, big = figures
    assert big["mae"] == pytest.approx(small["mae"] * 1000, rel=1e-3)
    assert big["rmse"] == pytest.approx(small["rmse"] * 1000, rel=1e-3)
    # predicting the mean is off by about the spread of the held-out targets (37..370 x scale)
    assert small["mae_of_mean"] > 10


def test_quality_rows_are_one_pass_not_multiplied_by_repeats():
    spec = parse_spec(spec_raw())
    tz, enc, schema = chunk(spec, 12, train_rows=8)
    eng = engine_for(spec, tz, enc, schema)
    for _ in range(3):
        eng.begin_predict_pass()
        eng.predict(tz, ("prediction",))
    assert eng.quality.metrics()["rows"] == 4


# --- settings that must not be ignored ----------------------------------------------------


@pytest.mark.slow
def test_compile_mode_options_and_adamw_keys_reach_the_model():
    spec = parse_spec(
        spec_raw(
            compile={"encoders": True, "mode": "max-autotune-no-cudagraphs", "options": {"epilogue_fusion": False}},
            adamw={"fused": False, "weight_decay": 0.2},
        )
    )
    tz, enc, schema = chunk(spec, 12, train_rows=8)
    eng = engine_for(spec, tz, enc, schema)
    cs = eng.model.compile_settings
    assert cs.mode == "max-autotune-no-cudagraphs"
    opts = cs.resolved_options()
    assert opts["epilogue_fusion"] is False and opts["max_autotune"] is True
    assert eng.model.optimizer.fused is False and eng.model.optimizer.weight_decay == 0.2
    eng.train(tz)
    assert [g["weight_decay"] for g in eng.optimizer.param_groups] == [0.2, 0.0]


def test_train_predict_with_a_checkpoint_resumes_the_optimizer(tmp_path):
    spec = parse_spec(spec_raw())
    tz, enc, schema = chunk(spec, 12, train_rows=8)
    first = engine_for(spec, tz, enc, schema)
    first.train(tz)
    steps = first.train_timings.updates
    path = tmp_path / "a.ckpt"
    save_run_checkpoint(path, first, enc, spec)

    resumed_spec = parse_spec({**spec_raw(checkpoint=str(path))})
    ck = load_run_checkpoint(path, resumed_spec)
    assert ck.optimizer is not None
    second = engine_for(resumed_spec, tz, ck.encoding, ck.schema, state=ck.model, optimizer_state=ck.optimizer)
    second.train(tz)
    state = next(iter(second.optimizer.state.values()))
    assert int(state["step"]) == steps + second.train_timings.updates


def test_resuming_with_other_optimizer_settings_is_refused(tmp_path):
    spec = parse_spec(spec_raw())
    tz, enc, schema = chunk(spec, 12, train_rows=8)
    first = engine_for(spec, tz, enc, schema)
    first.train(tz)
    path = tmp_path / "a.ckpt"
    save_run_checkpoint(path, first, enc, spec)
    other = parse_spec(spec_raw(checkpoint=str(path), adamw={"weight_decay": 0.5}))
    with pytest.raises(UserError, match=r"run.adamw.weight_decay: saved 0.01, spec 0.5"):
        load_run_checkpoint(path, other)


# --- loader workers -----------------------------------------------------------------------


def test_loader_is_built_once_and_persistent_workers_persist():
    spec = parse_spec(spec_raw(loader={"num_workers": 2, "persistent_workers": True}))
    tz, enc, schema = chunk(spec, 12, train_rows=8)
    assert tz.batch is None and tz.table is not None  # loader mode: workers encode
    eng = engine_for(spec, tz, enc, schema)
    eng.train(tz)
    assert eng.train_timings.updates == 2  # 8 training rows in batches of 4
    dm = eng.data_module()
    loader = dm._stream
    workers = {w.pid for w in loader._iterator._workers}
    eng.predict(tz, ("prediction",))
    eng.predict(tz, ("prediction",))
    assert eng.data_module() is dm and dm._stream is loader
    assert {w.pid for w in loader._iterator._workers} == workers
    assert eng.worker_startup_seconds > 0
    assert eng.quality.metrics()["rows"] == 8  # two passes, 4 held-out rows each
    eng.close()


def test_no_gradient_scaler_outside_cuda_fp16():
    spec = parse_spec(spec_raw(precision="bf16"))
    tz, enc, schema = chunk(spec, 12, train_rows=8)
    assert engine_for(spec, tz, enc, schema).scaler is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 training needs CUDA")
def test_fp16_training_on_cuda_scales_the_loss():
    spec = parse_spec(spec_raw(precision="fp16", device="cuda"))
    tz, enc, schema = chunk(spec, 12, train_rows=8)
    eng = Engine(spec, schema, torch.device("cuda"), None, Clock("cuda"), enc)
    assert isinstance(eng.scaler, torch.amp.GradScaler)
    eng.train(tz)
    assert eng.scaler.get_scale() > 1.0  # the scaler ran (its scale starts at 65536)
    assert all(torch.isfinite(p).all() for p in eng.model.parameters())
