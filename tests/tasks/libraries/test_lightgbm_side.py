"""``model.library: lightgbm`` inside the harness's chain (tasks/libraries/lightgbm: checks,
booster, side): what it refuses before work, its boosting stages, training through the
workload's epochs and chunks, predicting, quality on the held-out rows, the checkpoint."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from tasks.libraries.lightgbm import booster as B
from tasks.libraries.lightgbm.features import Flattening
from tasks.runtime.errors import UserError
from tasks.spec import parse_spec

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _spec(shop_spec: dict[str, Any], **run: Any) -> dict[str, Any]:
    spec = copy.deepcopy(shop_spec)
    spec["model"] = {"library": "lightgbm"}
    spec["run"] |= {"system_metrics_interval_s": 0, "batch_size": 2, **run}
    spec["task"]["validation_fraction"] = 0.4  # customers 1 and 4 held out (the stable key hash)
    return spec


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda s: s["schema"]["root"]["columns"].update(c_segment="text"), "schema.root.columns.c_segment='text'"),
        (lambda s: s["run"].update(backend="onnxruntime"), "run.backend='onnxruntime'"),
        (lambda s: s["run"].update(mode="predict"), "run.mode='predict'"),
        (lambda s: s["run"].update(precision="bf16"), "run.precision='bf16'"),
        (lambda s: s["run"].update(compile={"pools": True}), "run.compile.pools=True"),
        (lambda s: s["run"].update(device="cuda"), "run.device='cuda'"),
    ],
)
def test_what_it_cannot_honour_is_refused_naming_the_key(change, says, shop_spec):
    from tasks.libraries import check_library

    spec = _spec(shop_spec)
    change(spec)
    with pytest.raises(UserError, match="model.library lightgbm cannot honour") as err:
        check_library(parse_spec(spec))
    assert says in str(err.value)


def test_the_check_imports_neither_lightgbm_nor_torch_nor_polars():
    probe = (
        "import sys; from tasks.spec import load_spec; from tasks.libraries import check_library\n"
        "check_library(load_spec('benchmarks/tpch_orders.yaml', ['model.library=lightgbm']))\n"
        "print(sorted(m for m in ('lightgbm', 'torch', 'polars') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.stdout.split() == ["[]"], done.stdout + done.stderr


@pytest.mark.parametrize(("kind", "classes"), [("binary", ()), ("category", ("a", "b", "c")), ("regression", ())])
def test_two_stages_equal_one_booster_of_their_rounds_and_survive_a_checkpoint(kind, classes, tmp_path):
    import lightgbm as lgb

    rng = np.random.default_rng(0)
    x, noise = rng.normal(size=(600, 5)), rng.normal(size=600)  # noisy: a split always gains
    y = {"binary": x[:, 0] + noise > 0, "category": np.digitize(x[:, 1] + noise, [-0.5, 0.5]), "regression": x[:, 2]}[
        kind
    ]
    y = y.astype(np.float64)
    params = {**B.objective(kind, len(classes)), "verbose": -1, "seed": 0, "deterministic": True, "num_threads": 1}
    model = B.Ensemble(kind, Flattening(tuple(f"f{i}" for i in range(5)), (), {}), classes, params)
    for _ in range(2):  # two training passes (epochs) over the same rows
        stage = model.stage(x, y)
        for _ in range(B.ROUNDS):
            model.update(stage)
        assert not stage.finished and stage.rounds == B.ROUNDS
    one = lgb.Booster(params=params, train_set=lgb.Dataset(x, label=y, params={"verbose": -1}))
    for _ in range(2 * B.ROUNDS):
        one.update()
    expect = np.asarray(one.predict(x, raw_score=True))
    assert model.trees() == one.num_trees()
    np.testing.assert_allclose(model.raw(x), expect.reshape(model.raw(x).shape), rtol=0, atol=1e-9)
    spec = parse_spec({**_minimal(kind), "model": {"library": "lightgbm"}})
    model.save(tmp_path / "m.ckpt")
    again = B.Ensemble.load(tmp_path / "m.ckpt", spec)
    np.testing.assert_array_equal(again.raw(x), model.raw(x))
    assert again.classes == classes and again.flattening == model.flattening


def _minimal(kind: str) -> dict[str, Any]:
    return {
        "name": "m",
        "source": {"tables": {"t": "t.parquet"}},
        "schema": {"root": {"table": "t", "key": "k", "columns": {"a": "numeric"}}},
        "task": {"target": "y", "kind": kind},
    }


def test_a_checkpoint_of_another_task_kind_or_format_is_a_user_error(tmp_path):
    model = B.Ensemble("binary", Flattening(("a",), (), {}), (), {"objective": "binary", "num_threads": 1})
    model.save(tmp_path / "m.ckpt")
    with pytest.raises(UserError, match="trained for a binary task"):
        B.Ensemble.load(tmp_path / "m.ckpt", parse_spec(_minimal("regression")))
    (tmp_path / "x.ckpt").write_text("{}")
    with pytest.raises(UserError, match="not a LightGBM checkpoint"):
        B.Ensemble.load(tmp_path / "x.ckpt", parse_spec(_minimal("binary")))


def test_labels_follow_the_harness_convention():
    model = B.Ensemble("category", Flattening((), (), {}), ("no", "yes"), {})
    labels, present = model.labels(pa.table({"y": ["yes", None, "maybe", "no"]}), "y")
    # a known value outside the classes learned: UNSEEN_CLASS, never trained on or calibrated
    assert labels.tolist() == [1, 0, -1, 0] and present.tolist() == [True, False, False, True]
    model = B.Ensemble("binary", Flattening((), (), {}), (), {})
    labels, present = model.labels(pa.table({"y": pa.array([1, 0, None], pa.int32())}), "y")
    assert labels.tolist() == [1.0, 0.0, 0.0] and present.tolist() == [True, True, False]


def _workload(spec_dict: dict[str, Any], folder: Path) -> Any:
    from tasks.run.chain import Chain
    from tasks.run.scenarios.workload import Workload
    from tasks.sources.files import resolve_sources

    spec = parse_spec(spec_dict)
    work = Workload(Chain(spec, resolve_sources(spec, folder), torch.device("cpu")))
    work.list_keys()
    return work


def _predict_all(work: Any) -> tuple[pa.Table, dict[str, float]]:
    tables = []
    for i in range(len(work.chunks)):
        tz = work.prepare(i, "predict")
        engine = work.chain.engine  # built by the first prepared chunk (a checkpoint's too)
        tables.append(engine.predictions_table(tz.keys, engine.predict(tz, ("prediction",))))
    return pa.concat_tables(tables), engine.quality.metrics()


def test_train_and_predict_through_the_chain_with_rounds_as_training_batches(shop_spec, shop_tables, write_tables):
    """Two epochs over two chunks: four stages (a training batch is a round over the chunk's
    labelled training rows; with 1 or 2 rows LightGBM finds no split after its first round and
    says it is finished), every root row predicted once, the held-out rows scored."""
    c = shop_tables["customers"]
    churn = pa.array(["yes", "yes", "no", "yes", "no"])  # training rows 2, 3 (chunk 1) and 5 (chunk 2)
    folder = write_tables(dict(shop_tables, customers=c.set_column(c.schema.get_field_index("churn"), "churn", churn)))
    work = _workload(_spec(shop_spec, epochs=2, chunk_rows=4), folder)
    training = work.train()
    engine = work.chain.engine
    steps = engine.driver
    assert steps.rounds_run == engine.train_timings.updates == 4 and training.updates_per_epoch == 2
    assert len(steps.model.boosters) == 4 and steps.model.trees() == 4 * 2  # a tree per class and round
    table, m = _predict_all(work)
    assert table["c_id"].to_pylist() == [1, 2, 3, 4, 5]
    assert set(table["prediction"].to_pylist()) <= {"no", "yes"}
    assert m["rows"] == 2  # customers 1 and 4
    facts = engine.facts()
    assert facts.library == "lightgbm" and facts.flops_per_root_row is None and facts.parameters > 0
    assert facts.tags["relflow.backend"] == "lightgbm"


def test_a_checkpoint_predicts_what_the_run_predicted(shop_spec, shop_tables, write_tables, tmp_path):
    c = shop_tables["customers"]
    churn = pa.array(["yes", "yes", "no", "yes", "no"])
    folder = write_tables(dict(shop_tables, customers=c.set_column(c.schema.get_field_index("churn"), "churn", churn)))
    work = _workload(_spec(shop_spec), folder)
    work.train()
    trained, _ = _predict_all(work)
    path = tmp_path / "run.ckpt"
    work.chain.engine.save_checkpoint(path, work.spec)
    again = _workload(_spec(shop_spec, mode="predict", checkpoint=str(path)), folder)
    served, _ = _predict_all(again)
    assert served.equals(trained)
