"""``model.library: relational_transformers`` inside the harness (tasks/libraries/
relational_transformers/side.py): the whole flow on the shop tables (an encode stage row,
every root key predicted once, in key order), the same predictions with and without length
buckets through the side's chain, run.backend=triton refused before torch is imported, and
the constants the light check repeats equal to the library's.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.golden import check_golden

os.environ.setdefault("HF_HUB_OFFLINE", "1")

STAGES = ("retrieve", "preprocess", "encode", "tensorize", "compute", "calibrate", "write")


def rt_spec(shop_spec: dict[str, Any], **run: Any) -> dict[str, Any]:
    spec = copy.deepcopy(shop_spec)
    # two blocks: the lines branch is two foreign-key hops below the target (the check's rule)
    spec["model"] = {"library": "relational_transformers", "d_model": 8, "layers": 2, "heads": 2}
    spec["run"] |= {"system_metrics_interval_s": 0, **run}
    return spec


@pytest.mark.slow
def test_a_run_through_the_flow_has_an_encode_row_and_predicts_every_root_in_key_order(
    prefect_harness, shop_spec, shop_files, tmp_path, monkeypatch
):
    from mlflow.tracking import MlflowClient

    from flows.benchmark import benchmark
    from tasks.spec import parse_spec

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    spec = rt_spec(shop_spec, epochs=2, batch_size=2, bucketing="by_length")
    # customer 1 held out (the key hash at 0.3): a validation row, and both classes in training
    spec["task"]["validation_fraction"] = 0.3
    summary = benchmark(spec=parse_spec(spec).to_dict(), spec_dir=str(shop_files))
    run = MlflowClient(tracking_uri=uri).get_run(summary["run_id"])
    assert run.info.status == "FINISHED"
    assert {(r["phase"], r["stage"]) for r in summary["stages"]} == {
        *(("train", s) for s in STAGES[:5]),
        *(("predict", s) for s in STAGES),
    }
    m = run.data.metrics
    assert m["data.rows_predicted"] == m["data.rows_written"] == m["stage.encode.predict.rows"] == 5
    assert m["e2e.train.epochs"] == 2
    # present cells over the padded cells the batches materialised (per pass: one pass here)
    assert 0 < m["data.coords_present"] <= m["data.padded_coords"]
    # one meaning per key (issue 43 item 8): strings are not cells, and there is no reserved layout
    assert m["data.strings_encoded"] > 0 and m["encode.strings_per_s"] > 0
    assert not {"data.text_cells", "encode.cells_per_s", "data.coords_reserved", "data.occupancy"} & set(m)
    tags = run.data.tags
    assert tags["relflow.library"] == "relational_transformers"
    assert tags["relflow.library_version"] == "0.1.0"
    assert tags["relflow.library_bucketing"].startswith("by_length")
    table = pq.read_table(summary["output_path"])
    assert table["c_id"].to_pylist() == [1, 2, 3, 4, 5]
    assert set(table["prediction"].to_pylist()) <= {"yes", "no"}
    saved = Path(summary["checkpoint_path"])
    assert (saved / "config.json").is_file() and (saved / "head" / "head_config.json").is_file()
    check_golden("relational_transformers", run)  # issue 42: a structural change keeps every name


def _prepared(spec_dict: dict[str, Any], folder: Path) -> Any:
    """Every shop customer as one chunk through the side's chain, untimed; (engine, chunk)."""
    import torch

    from tasks.run.chain import Chain
    from tasks.sources.files import resolve_sources
    from tasks.spec import parse_spec
    from tasks.stages.retrieve import list_root_keys

    spec = parse_spec(spec_dict)
    chain = Chain(spec, resolve_sources(spec, folder), torch.device("cpu"))
    keys, _ = list_root_keys(spec, chain.sources)
    tz = chain.prepare_untimed(keys)
    engine = chain.ensure_engine()
    assert engine is not None
    return engine, tz


def test_planned_cells_are_what_the_collated_batches_hold(shop_spec, shop_files):
    """tensorize's present cells and the plan's padded cells come from the plan alone; the
    batches compute collates from that plan hold exactly those cells. There is no reserved
    layout (each batch pads to its own longest context): ``coords_reserved`` is None."""
    import torch

    from tasks.libraries.relational_transformers import cells_padded, cells_present
    from tasks.libraries.relational_transformers.contexts import planned_cells

    for bucketing in ("off", "by_length"):
        engine, tz = _prepared(rt_spec(shop_spec, batch_size=2, bucketing=bucketing), shop_files)
        parts = [p for p, _ in engine.driver.batches(tz, torch.arange(tz.root_rows))]
        assert tz.coords_present == sum(cells_present(p.batch) for p in parts)
        _, padded = planned_cells(tz.inputs.encoding.contexts.lengths, tz.inputs.plan)
        assert padded == sum(cells_padded(p.batch) for p in parts)
        assert tz.coords_reserved is None


def test_length_buckets_give_the_same_predictions_as_natural_order(shop_spec, shop_files):
    import torch

    runs = {}
    for bucketing in ("off", "by_length"):
        engine, tz = _prepared(rt_spec(shop_spec, batch_size=2, bucketing=bucketing), shop_files)
        prediction = engine.predict(tz, ("prediction",)).tensors["prediction"]
        runs[bucketing] = prediction, tz, sum(padded for _, padded in engine.batch_coords)
    (natural, tz_natural, padded_natural), (bucketed, tz_bucketed, padded_bucketed) = runs["off"], runs["by_length"]
    assert natural.shape == (5, 2)
    # same seed, same fresh weights; each prediction back in key order whatever the batch plan
    assert torch.allclose(natural, bucketed, atol=1e-5)
    assert tz_bucketed.coords_present == tz_natural.coords_present
    assert padded_bucketed < padded_natural  # buckets pad less


def test_rows_the_batches_were_not_built_for_are_collated_on_the_fly(shop_spec, shop_files):
    import torch

    engine, tz = _prepared(rt_spec(shop_spec, batch_size=2, bucketing="by_length"), shop_files)
    full = engine.predict(tz, ("prediction",)).tensors["prediction"]
    steps = engine.driver
    # the calibration fit's case: a subset of the rows, in an order of its own
    subset = torch.tensor([4, 1, 3])
    parts = [part for part, _ in steps.batches(tz, subset)]
    ran = torch.cat([steps.rows_of(part) for part in parts])
    assert sorted(ran.tolist()) == [1, 3, 4]
    got = torch.cat([steps.predict_step(part) for part in parts])
    assert torch.allclose(got, full[ran], atol=1e-5)
    # the full set of rows, in any order: the batches tensorize planned, in its plan's order
    # (the measured inputs), and their collation seconds counted
    before = dict(steps.collate_seconds)
    again = [part for part, _ in steps.batches(tz, torch.tensor([3, 0, 4, 2, 1]))]
    plan_rows = [tz.inputs.encoding.rows[torch.from_numpy(idx)] for idx in tz.inputs.plan]
    assert all(torch.equal(a.rows, r) for a, r in zip(again, plan_rows, strict=True))
    assert steps.collate_seconds == before  # no step consumed them


def test_triton_exits_2_before_torch_is_imported(tmp_path):
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "run",
            "--set",
            "model.library=relational_transformers",
            "--set",
            "run.backend=triton",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    out = " ".join((done.stdout + done.stderr).split())
    assert "model.library relational_transformers cannot honour run.backend='triton'" in out
    assert not (tmp_path / "data").exists()  # refused before any data was generated
    # the check itself loads neither torch nor the library (what makes the refusal fast)
    probe = (
        "import sys; from tasks.spec import load_spec; from tasks.libraries import check_library\n"
        "from tests.repo import REPO\n"
        "spec = load_spec(REPO / 'benchmarks' / 'tpch_orders.yaml', "
        "['model.library=relational_transformers', 'run.backend=triton'])\n"
        "try:\n    check_library(spec)\nexcept Exception as e:\n    print(type(e).__name__)\n"
        "print('torch' in sys.modules, 'relational_transformers' in sys.modules)\n"
    )
    repo = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=repo, timeout=120)
    assert done.stdout.split() == ["UserError", "False", "False"], done.stdout + done.stderr


def test_the_light_checks_repeat_the_librarys_constants():
    from relational_transformers.constants import MAX_F2P

    from tasks.libraries.relational_transformers import checks, contexts

    assert checks.MAX_PARENTS == MAX_F2P
    assert checks.D_TEXT == contexts.D_TEXT


def test_onnxruntime_serves_the_librarys_export_with_torchs_thread_count(shop_spec, shop_files):
    import torch

    engine, tz = _prepared(rt_spec(shop_spec, batch_size=2), shop_files)
    eager = engine.predict(tz, ("prediction",)).tensors["prediction"]
    engine, tz = _prepared(rt_spec(shop_spec, batch_size=2, backend="onnxruntime"), shop_files)
    served = engine.predict(tz, ("prediction",)).tensors["prediction"]
    assert torch.allclose(served, eager, atol=1e-5)
    steps = engine.driver
    assert steps.onnx is not None and steps.onnx.intra_op_threads == torch.get_num_threads()
    assert engine.facts().tags["relflow.onnxruntime.intra_op_threads"] == str(torch.get_num_threads())
    steps.close()
    assert steps._onnx_dir is None


# --- request scenarios: the note's steps inside each request ----------------------------------


def _many_shop(shop_tables: dict, copies: int = 8) -> dict:
    """The shop tables ``copies`` times over, keys shifted per copy: both classes among the
    training rows and held-out keys to draw requests from."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = {"customers": ("c_id",), "orders": ("o_id", "o_cust"), "lines": ("l_order",)}
    out = {}
    for name, table in shop_tables.items():
        parts = []
        for k in range(copies):
            t = table
            for col in keys[name]:
                t = t.set_column(t.schema.get_field_index(col), col, pc.add(t[col], 1000 * k))
            parts.append(t)
        out[name] = pa.concat_tables(parts)
    return out


# scripted seconds of the note's steps: context construction and cell encoding (the encode
# step), collation (as each batch is served: inside compute), the model (compute)
CONTEXTS_S, CELLS_S, COLLATE_S, MODEL_S = 1.0, 2.0, 3.0, 4.0


@pytest.mark.slow  # a trained RT model and a real request path
@pytest.mark.parametrize("scenario", ["single_stream", "server"])
def test_each_request_carries_the_notes_steps_with_their_own_seconds(
    scenario, shop_spec, shop_tables, write_tables, tmp_path, monkeypatch
):
    """A scripted clock moves only inside the library's steps (the real functions, each made
    to cost known seconds), so every request's latency and step figures are known exactly:
    encode 1 + 2 s, compute 3 s collation (one batch per request, collated as served) + 4 s
    model, the rest 0; the collation seconds are also their own figure."""
    import torch

    from tasks.libraries.relational_transformers import driver as driver_module
    from tasks.libraries.relational_transformers import side as side_module
    from tasks.measure import keys as K
    from tasks.measure.clock import Clock
    from tasks.run.chain import Chain
    from tasks.run.scenarios.runner import run_requests
    from tasks.run.scenarios.workload import Workload
    from tasks.sources.files import resolve_sources
    from tasks.spec import parse_spec
    from tasks.stages.write import PredictionWriter

    folder = write_tables(_many_shop(shop_tables))
    raw = rt_spec(shop_spec, scenario=scenario)
    # server: one request per batch, arrivals far apart (no queueing), so latency = service
    raw["run"]["request"] = {"min_requests": 5, "min_duration_s": 0, "target_qps": 0.001, "max_batch": 1}
    spec = parse_spec(raw)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += max(seconds, 0.0)

    work = Workload(
        Chain(
            spec, resolve_sources(spec, folder), torch.device("cpu"), clock=Clock(None, now=lambda: now[0], sleep=sleep)
        )
    )
    work.list_keys()
    work.train()

    def costs(seconds: float, fn):
        def step(*args, **kwargs):
            now[0] += seconds
            return fn(*args, **kwargs)

        return step

    monkeypatch.setattr(side_module, "build_contexts", costs(CONTEXTS_S, side_module.build_contexts))
    monkeypatch.setattr(side_module, "encode", costs(CELLS_S, side_module.encode))
    monkeypatch.setattr(side_module, "collate", costs(COLLATE_S, side_module.collate))
    monkeypatch.setattr(driver_module.RTDriver, "scores", costs(MODEL_S, driver_module.RTDriver.scores))
    writer = PredictionWriter(tmp_path / "requests.parquet")
    rec = run_requests(work, writer)
    writer.abort()

    n = rec.requests
    assert n >= 5
    expected = {
        "retrieve": 0.0,
        "preprocess": 0.0,
        "encode": CONTEXTS_S + CELLS_S,
        "tensorize": 0.0,  # the plan of one batch
        "compute": COLLATE_S + MODEL_S,
        "calibrate": 0.0,
        "write": 0.0,
    }
    total = sum(expected.values())
    assert rec.first_steps_s == expected  # the cold request too
    assert {s: v for s, v in rec.steps_s.items()} == {s: [v] * n for s, v in expected.items()}
    assert rec.latency_s == [total] * n and rec.queue_s == [0.0] * n
    m = rec.metrics()
    assert m[K.latency_request_ms(90)] == total * 1e3
    assert m[K.latency_step_share("encode")] == pytest.approx((CONTEXTS_S + CELLS_S) / total)
    assert m[K.latency_step_share("tensorize")] == 0.0
    assert m[K.latency_step_share("compute")] == pytest.approx((COLLATE_S + MODEL_S) / total)
    facts = work.chain.ensure_engine().facts()
    assert facts.metrics[K.compute("predict", K.LIBRARY_COLLATE_SECONDS)] == COLLATE_S * (n + 1)
    assert m[K.LATENCY_STEP_SHARE_OTHER] == 0.0
    # every request predicted its root through the library (one row written per request)
    assert work.stages["predict"]["compute"].calls == n + 1


def test_a_regression_chunk_carries_labels_in_the_targets_units(shop_spec, shop_files, shop_tables):
    """Quality compares predictions in the target's units with the chunk's labels: both must be
    in those units (the labels were the training-normalised values, so MAE/R² were wrong)."""
    import torch

    spec = rt_spec(shop_spec)
    del spec["schema"]["root"]["columns"]["c_balance"]  # the target is not an input
    spec["task"] = {"target": "c_balance", "kind": "regression"}
    engine, tz = _prepared(spec, shop_files)
    raw = dict(
        zip(
            shop_tables["customers"]["c_id"].to_pylist(), shop_tables["customers"]["c_balance"].to_pylist(), strict=True
        )
    )
    keys = tz.keys.to_pylist()
    want = torch.tensor([float(raw[k]) if raw[k] is not None else 0.0 for k in keys], dtype=torch.float32)
    present = torch.tensor([raw[k] is not None for k in keys])
    assert torch.equal(tz.label_present, present)
    assert torch.allclose(tz.labels[present], want[present], atol=1e-4)


def test_train_encode_and_tensorize_report_the_rows_they_built_contexts_for(shop_spec, shop_files):
    """A training chunk builds contexts for its training rows only: its encode and tensorize
    rows count those, retrieve and preprocess every row; a predict chunk counts every row."""
    import torch

    from tasks.run.chain import Chain
    from tasks.sources.files import resolve_sources
    from tasks.spec import parse_spec
    from tasks.stages.retrieve import list_root_keys

    raw = rt_spec(shop_spec)
    raw["task"]["validation_fraction"] = 0.3  # customer 1 held out; both classes in training
    spec = parse_spec(raw)
    chain = Chain(spec, resolve_sources(spec, shop_files), torch.device("cpu"))
    keys, _ = list_root_keys(spec, chain.sources)
    book: dict[str, dict[str, int]] = {"train": {}, "predict": {}}
    for phase in ("train", "predict"):
        p = chain.prepare(keys, lambda stage, s, rows, ph=phase: book[ph].__setitem__(stage, rows), {"phase": phase})
        training_rows = int(p.tz.is_train.sum())
    assert training_rows == 4 and len(keys) == 5
    assert book["train"] == {"retrieve": 5, "preprocess": 5, "encode": 4, "tensorize": 4}
    assert book["predict"] == {"retrieve": 5, "preprocess": 5, "encode": 5, "tensorize": 5}


def test_mfu_counts_the_steady_batches_present_and_padded_flops(shop_spec, shop_files):
    """compute.model_flops_per_s (present) and ..._reserved (padded) of a relational-transformers
    run are the steady predict batches' FLOPs at each context's own length and at the batch's
    longest, over the steady seconds (natural order, batches of two: padding). Before, both were
    the first batch's per-row count times the steady rows: equal, whatever the padding."""
    import torch

    from tasks.measure import keys as K
    from tasks.run.record.collect import utilisation

    engine, tz = _prepared(rt_spec(shop_spec, batch_size=2, warmup_batches=0), shop_files)
    engine.predict(tz, ("prediction",))
    facts = engine.facts()
    fm, cells, t = facts.flop_model, engine.steady_cells, engine.predict_timings
    assert fm is not None and cells.contexts == sum(t.steady_rows) == 3  # 5 rows less the first call's 2
    m = utilisation(engine.spec, torch.device("cpu"), engine, facts)
    seconds = sum(t.steady_seconds)
    present, padded = cells.present_flops(fm), cells.padded_flops(fm)
    assert present < padded
    assert m[K.compute("predict", K.MODEL_FLOPS_PER_S)] == pytest.approx(present / seconds, rel=1e-9)
    assert m[K.compute("predict", K.MODEL_FLOPS_PER_S_RESERVED)] == pytest.approx(padded / seconds, rel=1e-9)
    peak = m[K.HOST_PEAK_FLOPS_PER_S]
    assert m[K.compute("predict", K.MFU)] == pytest.approx(present / seconds / peak, rel=1e-9)
