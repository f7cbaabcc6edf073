"""Train -> predict from the run's own checkpoint, on every backend and through ``export``.

A training run reserves ``min(max_length, observed rows per parent)`` per branch, so the
checkpoint's lengths can be below the spec's ``max_length``. Every path that loads a saved
model (checkpoint, bundle, ONNX Runtime after export, the export command) must resolve the
lengths with the same rule (tasks/backends/lengths.py); once ONNX Runtime and export compared
the checkpoint against the configured spec first and refused it as "a different schema".
Cheap: the hand-made shop workload, a tiny model, the chain and engine objects directly."""

from __future__ import annotations

import copy
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from tasks.runtime.errors import UserError
from tasks.spec import parse_spec


def _configured(shop_spec: dict, **run: object) -> dict:
    d = copy.deepcopy(shop_spec)
    # the data holds at most 3 orders per customer and 4 lines per order: reserved 3 and 4
    d["schema"]["branches"][0]["max_length"] = 5
    d["schema"]["branches"][0]["branches"][0]["max_length"] = 6
    d["model"] = {"d_model": 16, "layers": 1, "heads": 2}
    d["run"].update(run)
    return d


@pytest.fixture
def shop_plus(shop_tables, write_tables) -> Path:
    """The shop tables plus seven customers without orders: enough labelled rows for the data
    checks' split (five customers leave one side empty or single-class)."""
    extra = pa.table(
        {
            "c_id": pa.array(range(6, 13), pa.int64()),
            "c_balance": pa.array([float(i) for i in range(6, 13)]),
            "c_segment": pa.array(["a", "b"] * 3 + ["c"]),
            "c_since": pa.array([None] * 7, pa.date32()),
            "churn": pa.array(["yes", "no"] * 3 + ["yes"]),
        }
    )
    return write_tables({**shop_tables, "customers": pa.concat_tables([shop_tables["customers"], extra])})


@pytest.fixture
def own_checkpoint(shop_spec, shop_plus, tmp_path):
    """A train+predict run's checkpoint: trained under the lengths the data checks reserve."""
    from tasks.backends.checkpoint import save_run_checkpoint
    from tasks.run.chain import Chain
    from tasks.run.checks.data import check_data_before_work
    from tasks.sources.files import resolve_sources
    from tasks.stages.retrieve import list_root_keys

    configured = parse_spec(_configured(shop_spec, output_dir=str(tmp_path / "out")))
    sources = resolve_sources(configured, shop_plus)
    reserved, metrics, _ = check_data_before_work(configured, sources)
    assert (metrics["data.reserved_rows.orders"], metrics["data.reserved_rows.lines"]) == (3.0, 4.0)
    chain = Chain(reserved, sources, torch.device("cpu"))
    keys, _ = list_root_keys(reserved, sources)
    tz = chain.prepare_untimed(keys)
    assert chain.engine is not None and chain.encoding is not None
    chain.engine.train(tz)
    path = tmp_path / "out" / "shop.ckpt"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_run_checkpoint(path, chain.engine, chain.encoding, configured)  # as the flow saves it
    return path, sources


def _predict(shop_spec: dict, sources, ckpt: Path, tmp_path: Path, **run: object) -> dict[str, torch.Tensor]:
    """The flow's predict path (plan's checks and loads, then the backend) without Prefect."""
    from tasks.backends.checkpoint import load_run_checkpoint
    from tasks.run.backend_setup import check_backend, start_backend
    from tasks.run.chain import Chain, Weights
    from tasks.run.checks.data import check_data_before_work
    from tasks.stages.retrieve import list_root_keys

    configured = parse_spec(
        _configured(shop_spec, mode="predict", checkpoint=str(ckpt), output_dir=str(tmp_path / "out"), **run)
    )
    spec, _, _ = check_data_before_work(configured, sources)
    loaded = load_run_checkpoint(ckpt, spec)
    plan, loaded = check_backend(spec, loaded)
    assert loaded is not None
    chain = Chain(
        spec,
        sources,
        torch.device("cpu"),
        weights=Weights.of(loaded),
    )
    engine = chain.ensure_engine()
    assert engine is not None
    from tasks.measure.clock import Clock

    start_backend(configured, engine, plan, ckpt, loaded.load, Clock())
    keys, _ = list_root_keys(spec, sources)
    return engine.predict(chain.prepare_untimed(keys), ("prediction",)).tensors


def test_the_rule_keeps_a_saved_length_up_to_max_length_and_nothing_above():
    from tasks.backends.lengths import reserved_length

    assert reserved_length(8, saved=7, observed=3) == 7  # a saved model fixes its lengths
    assert reserved_length(8, saved=9, observed=3) == 3  # above max_length: not this spec's model
    assert reserved_length(8, saved=None, observed=7) == 7
    assert reserved_length(8, saved=None, observed=12) == 8
    assert reserved_length(8, saved=None, observed=0) == 1
    assert reserved_length(8, saved=None, observed=None) == 8


@pytest.mark.slow
def test_pytorch_and_onnxruntime_predict_from_the_run_checkpoint_agree(own_checkpoint, shop_spec, tmp_path):
    ckpt, sources = own_checkpoint
    eager = _predict(shop_spec, sources, ckpt, tmp_path)["prediction"]
    ort = _predict(shop_spec, sources, ckpt, tmp_path, backend="onnxruntime")["prediction"]
    assert eager.shape == ort.shape == (12, 2)
    torch.testing.assert_close(ort.float(), eager.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_export_of_the_run_checkpoint_and_predict_from_its_bundle(own_checkpoint, shop_spec, tmp_path):
    from tasks.backends.bundle import export_bundle
    from tasks.backends.lengths import saved_lengths

    ckpt, sources = own_checkpoint
    configured = parse_spec(_configured(shop_spec))
    bundle = export_bundle(ckpt, configured, ("prediction",), tmp_path / "bundles")  # what `export` calls
    assert saved_lengths(bundle.schema) == {"orders": 3, "lines": 4}
    eager = _predict(shop_spec, sources, ckpt, tmp_path)["prediction"]
    # the bundle alone (no run.checkpoint): its lengths, not the predict data's, are reserved
    ort = _predict(shop_spec, sources, ckpt, tmp_path, backend="onnxruntime", onnxruntime={"model": str(bundle.path)})[
        "prediction"
    ]
    torch.testing.assert_close(ort.float(), eager.float(), rtol=1e-4, atol=1e-4)


def test_a_checkpoint_longer_than_max_length_is_still_refused(own_checkpoint, shop_spec, tmp_path):
    from tasks.backends.checkpoint import load_run_checkpoint

    ckpt, _ = own_checkpoint
    d = _configured(shop_spec, mode="predict", checkpoint=str(ckpt))
    d["schema"]["branches"][0]["max_length"] = 2  # the checkpoint reserved 3 orders
    with pytest.raises(UserError, match="different schema"):
        load_run_checkpoint(ckpt, parse_spec(d))


def test_checkpoint_checks_accept_the_run_checkpoint_under_its_configured_spec(own_checkpoint, shop_spec):
    """The check every loader calls, against the configured spec (max_length 5 and 6)."""
    from model.checkpoint import load_checkpoint
    from tasks.backends.checkpoint import check_matches_spec

    ckpt, _ = own_checkpoint
    saved = load_checkpoint(ckpt).model
    check_matches_spec(saved.schema, saved.config, parse_spec(_configured(shop_spec)), "checkpoint")


def test_a_reference_must_reserve_the_runs_lengths(own_checkpoint, shop_spec):
    """The reference scores rows the run's chain tensorized: the rule that accepts a saved
    length below max_length must not let a shorter reference through to fail after the run."""
    from tasks.backends.lengths import with_lengths
    from tasks.run.reference_pass import check_reference

    ckpt, _ = own_checkpoint
    configured = parse_spec(_configured(shop_spec, mode="predict", reference_checkpoint=str(ckpt)))
    with pytest.raises(UserError, match="reserves"):
        check_reference(configured, None)  # a run reserving 5 and 6
    assert check_reference(with_lengths(configured, {"orders": 3, "lines": 4}), None) is not None
