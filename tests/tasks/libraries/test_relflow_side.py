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
    from tasks.run.chain import Chain
    from tasks.sources.files import resolve_sources
    from tasks.spec import parse_spec

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


class ScriptedBatchClock:
    """relflow's ``perf_counter`` in its ThroughputLogger, scripted: each batch's start hook
    reads it once and its end hook once, so batch i lasts exactly ``seconds[i]``."""

    def __init__(self, seconds: list[float]) -> None:
        self.seconds, self.t, self.reads = iter(seconds), 0.0, 0

    def __call__(self) -> float:
        self.reads += 1
        self.t += next(self.seconds) if self.reads % 2 == 0 else 100.0  # an end hook: the batch's seconds
        return self.t


def test_relflows_logged_rate_beside_the_exact_rows_and_the_estimate_on_a_partial_last_batch(
    shop_spec, shop_files, monkeypatch
) -> None:
    import relflow.logging.throughput as relflow_throughput

    from tasks.measure import keys as K
    from tasks.stages.retrieve import list_root_keys

    # batches of 2: training rows (3) run as 2 + 1, the 5 predict rows as 2 + 2 + 1; no
    # warm-up, so each phase's first batch is its first call and the rest are steady
    chain = _chain(relflow_spec(shop_spec, batch_size=2, warmup_batches=0), shop_files)
    keys, _ = list_root_keys(chain.spec, chain.sources)
    clock = ScriptedBatchClock([0.5, 0.25, 0.5, 0.4, 0.125])  # train 2, then predict 3 batches
    monkeypatch.setattr(relflow_throughput, "perf_counter", clock)
    train = chain.prepare(keys, lambda *_: None, {"phase": "train"}).tz  # strata=train
    engine = chain.ensure_engine()
    assert engine is not None
    engine.train(train)
    engine.predict(chain.prepare_untimed(keys), ("prediction",))
    assert clock.reads == 2 * 5  # relflow's hooks ran once around each timed batch, no more
    m = engine.facts().metrics
    # relflow divides each batch's own rows by its hook seconds: train steady 1 row / 0.25 s;
    # predict steady 2 rows / 0.4 s and the partial last batch 1 row / 0.125 s
    assert m[K.compute("train", K.LIBRARY_LOGGER_STEADY_MEAN_ROWS_PER_S)] == pytest.approx(4.0)
    assert m[K.compute("train", K.LIBRARY_LOGGER_LAST_ROWS_PER_S)] == pytest.approx(4.0)
    assert m[K.compute("predict", K.LIBRARY_LOGGER_STEADY_MEAN_ROWS_PER_S)] == pytest.approx((5.0 + 8.0) / 2)
    assert m[K.compute("predict", K.LIBRARY_LOGGER_LAST_ROWS_PER_S)] == pytest.approx(8.0)
    assert K.LIBRARY_LOGGER_TRAIN_LAST_LOSS in m
    # the harness's exact figure and the note's estimate over the same steady batches (3 rows,
    # counted as 2 x 2 = 4 by the estimate), timed by the harness's own clock
    steady_s = sum(engine.predict_timings.steady_seconds)
    assert engine.predict_timings.steady_rows == [2, 1]
    assert engine.predict_timings.steady_rows_per_s == pytest.approx(3 / steady_s)
    sent = engine.flush_throughput(type("Sink", (), {"log": lambda self, metrics, step: None})())
    assert sent[K.compute("predict", K.ESTIMATED_ROWS_PER_S)] == pytest.approx(4 / steady_s)
    # an untracked pass (the output check's, after the timed region) changes none of them
    monkeypatch.setattr(relflow_throughput, "perf_counter", ScriptedBatchClock([9.0] * 6))
    chain.predict_untimed(keys)
    assert engine.facts().metrics == m


def test_initial_weights_follow_run_seed_not_the_global_generator(shop_spec, shop_files) -> None:
    from tasks.stages.retrieve import list_root_keys

    def initial(seed: int, draws: int) -> list[torch.Tensor]:
        chain = _chain(relflow_spec(shop_spec, seed=seed), shop_files)
        keys, _ = list_root_keys(chain.spec, chain.sources)
        torch.rand(draws)  # whatever ran before in the process
        chain.prepare_untimed(keys)
        return [p.detach().clone() for p in chain.side.driver.model.parameters()]

    a, b, c = initial(0, 1), initial(0, 7), initial(1, 1)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))


def test_logits_for_a_scattered_subset_of_rows_match_the_full_pass(shop_spec, shop_files) -> None:
    """The calibration fit asks for the held-out rows only, scattered and in an order of their
    own (tasks/stages/calibrate.py): each logit must be its row's, as in the full predict pass."""
    from tasks.stages.retrieve import list_root_keys

    chain = _chain(relflow_spec(shop_spec), shop_files)
    keys, _ = list_root_keys(chain.spec, chain.sources)
    train = chain.prepare(keys, lambda *a: None, {"phase": "train"}).tz
    chain.train(train, lambda *a: None)
    engine = chain.ensure_engine()
    assert engine is not None
    tz = chain.prepare(keys, lambda *a: None, {"phase": "predict"}).tz
    full = engine.predict(tz, ("prediction",)).tensors["prediction"]
    steps = engine.driver
    subset = torch.tensor([4, 1, 3])
    parts = [part for part, _ in steps.batches(tz, subset)]
    ran = torch.cat([steps.rows_of(part) for part in parts])
    got = torch.cat([steps.predict_step(part) for part in parts])
    assert ran.tolist() == [4, 1, 3]
    assert torch.allclose(got, full[ran], atol=1e-5)
