"""Served outputs vs an offline pass over the same keys (run.request.check_outputs), and the
repeated-key ratio (requests.repeat_key_speedup), through the real request path and chain on
the hand-made shop workload.

- served predictions equal the offline pass (same weights, backend, temperature): nothing
  mismatched, and the offline pass moves no run figure;
- a serving path that computes something else (a backend that adds 1e-3 while serving, or
  only to a repeated key, as a stale cache would) is INVALID, the reason naming the figure,
  the tolerance and the worst root;
- the tolerance table by serving numerics;
- the repeat ratio on hand-made latencies, and through single_stream on a fake clock."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks.measure import keys as K
from tasks.measure.clock import Clock
from tasks.run.scenarios import server, single_stream
from tasks.run.scenarios.outputs import check_outputs, repeat_key_speedup
from tasks.spec import parse_spec
from tasks.spec.tolerance import OUTPUT_TOLERANCE, output_tolerance

TEMPERATURE = 1.7  # not 1: an offline pass without the served calibration would differ


class Perturbed:
    """A backend wrapper that adds ``delta`` to the prediction of the rows ``hit`` selects."""

    def __init__(self, inner, delta: float, hit=lambda batch: True) -> None:
        self.inner, self.delta, self.hit, self.name = inner, delta, hit, inner.name

    def encoder_path(self) -> str:
        return self.inner.encoder_path()

    def tags(self) -> dict[str, str]:
        return self.inner.tags()

    def step(self, batch, outputs):
        outs = dict(self.inner.step(batch, outputs))
        if self.hit(batch):
            outs["prediction"] = outs["prediction"] + self.delta
        return outs


@pytest.fixture(scope="module")
def trained_once(shop_kit, many_shop_folder):
    """A trained tiny engine with a fitted-looking temperature (once per module: every test
    puts back the backend it swaps), and the held-out keys to ask for."""
    from tasks.run.chain import Chain
    from tasks.run.scenarios.schedule import validation_keys
    from tasks.run.scenarios.workload import Workload
    from tasks.sources.files import resolve_sources

    shop_spec = shop_kit.spec()
    shop_spec["model"] = {"d_model": 16, "layers": 1, "heads": 2}
    shop_spec["run"]["scenario"] = "single_stream"
    spec = parse_spec(shop_spec)
    work = Workload(Chain(spec, resolve_sources(spec, many_shop_folder), torch.device("cpu")))
    work.list_keys()
    work.train()
    work.chain.set_temperature(TEMPERATURE)
    pool = validation_keys(np.concatenate(work.chunks), spec, work.chain.sources)
    assert len(pool) >= 4
    return spec, work, pool


@pytest.fixture
def trained(trained_once, tmp_path):
    spec, work, pool = trained_once
    return spec, work, pool, tmp_path


def _single_stream(work, pool, tmp_path):
    from tasks.run.scenarios.request import RequestPath
    from tasks.stages.write import PredictionWriter

    writer = PredictionWriter(tmp_path / "requests.parquet")
    path = RequestPath(work, writer)
    stream = [pool[:1]] * 5 + [pool[1:2], pool[2:3]]  # cold + four repeats of one key + two others
    rec = single_stream.run(path, iter(stream), work.chain.clock, min_requests=6, min_duration_s=0, settle=path.settle)
    writer.abort()
    return rec, path


def test_served_outputs_equal_the_offline_pass(trained):
    spec, work, pool, tmp_path = trained
    rec, path = _single_stream(work, pool, tmp_path)
    assert path.outputs is not None and len(path.outputs.keys) == 7  # every call, the cold one included
    check = check_outputs(work.chain, path.outputs, spec.run)
    assert check.roots_checked == 3 and check.servings == 7
    # one row alone vs a chunk of three: float32 reduction order only (measured 8e-8)
    assert check.max_abs_diff < 1e-6 and check.mismatched_roots == 0
    assert check.reasons() == []
    rec.output_check = check
    m = rec.metrics()
    assert m[K.REQUESTS_OUTPUTS_MAX_ABS_DIFF] == check.max_abs_diff and m[K.REQUESTS_OUTPUTS_MISMATCHED_ROOTS] == 0.0
    assert m[K.REQUESTS_OUTPUTS_TOLERANCE] == 1e-5
    for key in m:
        assert K.documented(key), key


def test_server_batches_equal_the_offline_pass(trained):
    """A server batch serves several roots in one call: each root is compared on its own."""
    from tasks.run.scenarios.request import RequestPath
    from tasks.stages.write import PredictionWriter

    spec, work, pool, tmp_path = trained
    writer = PredictionWriter(tmp_path / "server.parquet")
    path = RequestPath(work, writer)
    keys = np.stack([pool[:1], pool[1:2], pool[2:3], pool[:1], pool[3:4]])
    server.run(
        path, np.zeros(5), keys, work.chain.clock, max_batch=3, max_wait_s=0.0, cold_keys=pool[3:4], settle=path.settle
    )
    writer.abort()
    check = check_outputs(work.chain, path.outputs, spec.run)
    assert check.roots_checked == 4 and check.servings == 1 + 3 + 2  # cold, a batch of 3, the rest (2)
    assert check.mismatched_roots == 0 and check.max_abs_diff <= OUTPUT_TOLERANCE["fp32"]


def _figures(work) -> tuple:
    """Every figure of the engine and chain the offline check could move."""
    engine, chain = work.chain.engine, work.chain
    t = engine.predict_timings
    return (
        t.first_call_seconds,
        list(t.warmup_seconds),
        list(t.steady_seconds),
        list(engine.batch_coords),
        set(engine.batch_shapes),
        engine.quality.metrics(),
        chain.calibration.metrics(),
        engine.wall_seconds,
        dict(engine.steady_shapes["predict"]),
        engine.throughput["predict"].batches,
    )


def test_the_offline_pass_moves_no_run_figure(trained):
    spec, work, pool, tmp_path = trained
    rec, path = _single_stream(work, pool, tmp_path)
    before = _figures(work)
    check_outputs(work.chain, path.outputs, spec.run)
    assert _figures(work) == before


def test_a_perturbed_serving_path_is_invalid(trained):
    spec, work, pool, tmp_path = trained
    engine = work.chain.engine
    real = engine.backend
    engine.serve_with(Perturbed(real, 1e-3))
    _, path = _single_stream(work, pool, tmp_path)
    engine.serve_with(real)  # the offline pass: what the weights compute
    check = check_outputs(work.chain, path.outputs, spec.run)
    # calibrate divides the logits by the temperature: the served values moved by 1e-3 / T
    assert check.max_abs_diff == pytest.approx(1e-3 / TEMPERATURE, rel=1e-3)
    assert check.mismatched_roots == 3
    (reason,) = check.reasons()
    assert K.REQUESTS_OUTPUTS_MAX_ABS_DIFF in reason and "fp32 tolerance 1e-05" in reason
    assert f"worst root {check.worst_root}" in reason and check.worst_root in {str(k) for k in pool[:3]}


def test_a_stale_repeated_key_is_the_worst_root(trained):
    """Only the repeated key's later servings differ (a cache that went stale): one root."""
    spec, work, pool, tmp_path = trained
    engine = work.chain.engine
    calls = {"n": 0}

    def repeat_of_first_key(batch) -> bool:
        calls["n"] += 1
        return 2 <= calls["n"] <= 5  # the first key's second to fifth servings

    real = engine.backend
    engine.serve_with(Perturbed(real, 1e-3, repeat_of_first_key))
    _, path = _single_stream(work, pool, tmp_path)
    engine.serve_with(real)
    check = check_outputs(work.chain, path.outputs, spec.run)
    assert check.mismatched_roots == 1 and check.worst_root == str(pool[0])
    assert check.reasons() and "1 of 3 served roots" in check.reasons()[0]


def test_check_outputs_off_keeps_nothing(shop_spec, many_shop_files, tmp_path):
    from tasks.run.chain import Chain
    from tasks.run.scenarios.request import RequestPath
    from tasks.run.scenarios.workload import Workload
    from tasks.sources.files import resolve_sources
    from tasks.stages.write import PredictionWriter

    shop_spec["run"]["scenario"] = "single_stream"
    shop_spec["run"]["mode"] = "predict"
    shop_spec["run"]["request"] = {"check_outputs": False}
    spec = parse_spec(shop_spec)
    work = Workload(Chain(spec, resolve_sources(spec, many_shop_files), torch.device("cpu")))
    work.list_keys()
    path = RequestPath(work, PredictionWriter(tmp_path / "p.parquet"))
    assert path.outputs is None
    assert parse_spec({**shop_spec, "run": {"scenario": "single_stream"}}).run.request.check_outputs is True


@pytest.mark.parametrize(
    ("run", "row", "tolerance"),
    [
        ({}, "fp32", 1e-5),
        ({"precision": "bf16"}, "bf16", 5e-2),
        ({"precision": "fp16"}, "fp16", 5e-3),
        ({"backend": "onnxruntime"}, "onnxruntime", 1e-4),
        ({"backend": "onnxruntime", "onnxruntime": {"quantization": "dynamic_int8"}}, "int8", 5e-2),
        ({"backend": "triton"}, "triton", 1e-4),
    ],
)
def test_tolerance_by_serving_numerics(shop_spec, run, row, tolerance):
    shop_spec["run"].update(run)
    assert output_tolerance(parse_spec(shop_spec).run) == (row, tolerance)


def test_repeat_key_speedup_on_hand_made_latencies():
    keys = [np.array([1]), np.array([2]), np.array([1]), np.array([1]), np.array([3]), np.array([2])]
    lat = [4.0, 1.0, 2.0, 1.0, 5.0, 1.0]
    m = repeat_key_speedup(keys, lat)
    # key 1: first 4, later 2 and 1 (median 1.5): 8/3; key 2: first 1, later 1: 1; key 3 once
    assert m[K.REQUESTS_REPEAT_KEYS] == 2
    assert m[K.REQUESTS_REPEAT_KEY_SPEEDUP] == pytest.approx(np.median([4 / 1.5, 1.0]))
    # two roots per request: a key counts each request it is in
    m = repeat_key_speedup([np.array([1, 2]), np.array([2, 3]), np.array([1, 3])], [3.0, 1.0, 1.0])
    assert m[K.REQUESTS_REPEAT_KEYS] == 3  # 1: 3/1, 2: 3/1, 3: 1/1
    assert m[K.REQUESTS_REPEAT_KEY_SPEEDUP] == pytest.approx(3.0)
    assert repeat_key_speedup([np.array([1]), np.array([2])], [1.0, 1.0]) == {K.REQUESTS_REPEAT_KEYS: 0.0}


def test_a_cache_shows_in_the_repeat_ratio():
    """single_stream on a fake clock: a key served before costs a tenth (a cache); the cold
    request is left out, so its key's first steady serving is the first one compared."""
    seen: set[int] = set()
    t = {"now": 0.0}
    clock = Clock(None, now=lambda: t["now"], sleep=lambda s: None)

    def serve(keys: np.ndarray) -> dict[str, float]:
        cost = 0.1 if int(keys[0]) in seen else 1.0
        seen.add(int(keys[0]))
        t["now"] += cost
        return {"compute": cost}

    stream = iter([np.array([9])] + [np.array([k]) for k in (1, 2, 1, 2, 1, 9, 9)])
    rec = single_stream.run(serve, stream, clock, min_requests=7, min_duration_s=0)
    m = rec.metrics()
    # keys 1 and 2: first 1.0, later 0.1 -> 10; key 9: cached since the cold request, 0.1 / 0.1 -> 1
    assert m[K.REQUESTS_REPEAT_KEYS] == 3
    assert m[K.REQUESTS_REPEAT_KEY_SPEEDUP] == pytest.approx(10.0)

    def uncached(keys: np.ndarray) -> dict[str, float]:  # every serving costs the same
        t["now"] += 1.0
        return {"compute": 1.0}

    rec = single_stream.run(uncached, iter([np.array([1])] * 6), clock, min_requests=5, min_duration_s=0)
    assert rec.metrics()[K.REQUESTS_REPEAT_KEY_SPEEDUP] == pytest.approx(1.0)


def test_a_branch_target_compares_present_cells_only(shop_spec, many_shop_files, tmp_path):
    """A per-order target: cells of absent orders (padding) are not outputs, so a backend that
    writes anything there matches; one that moves a present cell does not."""
    from tasks.run.chain import Chain
    from tasks.run.scenarios.request import RequestPath
    from tasks.run.scenarios.schedule import validation_keys
    from tasks.run.scenarios.workload import Workload
    from tasks.sources.files import resolve_sources
    from tasks.stages.write import PredictionWriter

    shop_spec["task"] = {"target": "o_status", "branch": "orders", "kind": "category"}
    shop_spec["run"].update(scenario="single_stream", mode="predict")  # untrained weights: outputs all the same
    spec = parse_spec(shop_spec)
    work = Workload(Chain(spec, resolve_sources(spec, many_shop_files), torch.device("cpu")))
    work.list_keys()
    pool = validation_keys(np.concatenate(work.chunks), spec, work.chain.sources)

    def serve(backend_of) -> tuple:
        writer = PredictionWriter(tmp_path / "branch.parquet")
        path = RequestPath(work, writer)
        engine = work.chain.engine
        real = engine.backend
        engine.serve_with(backend_of(real))
        rec = single_stream.run(
            path,
            iter([pool[i : i + 1] for i in range(5)]),
            work.chain.clock,
            min_requests=4,
            min_duration_s=0,
            settle=path.settle,
        )
        engine.serve_with(real)
        writer.abort()
        return rec, check_outputs(work.chain, path.outputs, spec.run)

    class OnCells(Perturbed):
        def __init__(self, inner, present: bool) -> None:
            super().__init__(inner, 1.0)
            self.present = present

        def step(self, batch, outputs):
            outs = dict(self.inner.step(batch, outputs))
            mask = batch.nodes["orders"].present
            cells = mask if self.present else ~mask
            outs["prediction"] = outs["prediction"] + self.delta * cells.unsqueeze(-1)
            return outs

    _, padding = serve(lambda real: OnCells(real, present=False))
    assert padding.mismatched_roots == 0 and padding.max_abs_diff < 1e-6
    _, present = serve(lambda real: OnCells(real, present=True))
    with_orders = {str(k) for k in pool[:5]}  # roots with at least one order are mismatched
    assert 0 < present.mismatched_roots <= 5 and present.worst_root in with_orders
    assert present.max_abs_diff == pytest.approx(1.0 / work.chain.temperature, rel=1e-4)


@pytest.fixture(scope="module")
def bucketed_once(shop_kit, many_shop_folder):
    """A trained tiny engine serving offline passes bucketed by length, packed (run.check_outputs)."""
    from tasks.run.chain import Chain
    from tasks.run.scenarios.workload import Workload
    from tasks.sources.files import resolve_sources

    shop_spec = shop_kit.spec()
    shop_spec["model"] = {"d_model": 16, "layers": 1, "heads": 2}
    shop_spec["run"].update(bucketing="by_length", packing="auto", check_outputs=True, chunk_rows=16)
    spec = parse_spec(shop_spec)
    work = Workload(Chain(spec, resolve_sources(spec, many_shop_folder), torch.device("cpu")))
    work.list_keys()
    work.train()
    work.chain.set_temperature(TEMPERATURE)
    return spec, work


def _offline_pass(work, tmp_path):
    from tasks.run.scenarios.offline import predict_pass
    from tasks.stages.write import PredictionWriter

    writer = PredictionWriter(tmp_path / "offline.parquet")
    _, kept = predict_pass(work, writer, 0)
    writer.abort()
    assert kept is not None and len(kept.keys) == len(work.chunks) == 3
    return kept


def test_offline_bucketed_packed_pass_equals_the_plain_pass(bucketed_once, tmp_path):
    from tasks.run.scenarios.outputs import check_offline_outputs

    spec, work = bucketed_once
    check = check_offline_outputs(work.chain, _offline_pass(work, tmp_path))
    assert check.roots_checked == check.servings == 40  # every root row of the pass, once
    assert check.mismatched_roots == 0 and check.max_abs_diff < 1e-6, check
    m = check.metrics()
    assert set(m) == {
        K.PREDICT_OUTPUTS_MAX_ABS_DIFF,
        K.PREDICT_OUTPUTS_MISMATCHED_ROOTS,
        K.PREDICT_OUTPUTS_ROOTS_CHECKED,
        K.PREDICT_OUTPUTS_TOLERANCE,
    }
    assert all(K.documented(k) for k in m)


def test_offline_perturbed_backend_is_invalid_against_the_plain_pass(bucketed_once, tmp_path):
    from tasks.run.scenarios.outputs import check_offline_outputs

    spec, work = bucketed_once
    engine = work.chain.engine
    real = engine.backend
    engine.serve_with(Perturbed(real, 1e-3))
    try:
        served = _offline_pass(work, tmp_path)
    finally:
        engine.serve_with(real)
    check = check_offline_outputs(work.chain, served)
    assert check.mismatched_roots == 40
    assert check.max_abs_diff == pytest.approx(1e-3 / TEMPERATURE, rel=1e-3)
    (reason,) = check.reasons()
    assert reason.startswith(f"{K.PREDICT_OUTPUTS_MAX_ABS_DIFF} ") and "a plain pass" in reason


def test_run_check_outputs_is_offline_only(shop_spec):
    shop_spec["run"].update(scenario="single_stream", check_outputs=True)
    with pytest.raises(Exception, match="run.request.check_outputs"):
        parse_spec(shop_spec)


def test_the_tolerance_is_absolute_near_zero_and_relative_for_large_values():
    """|a - b| / max(1, |b|) per cell, the worst cell per row; the absolute max is reported apart.
    A fixed absolute tolerance marked float32 rounding of a calibrated logit near 483 (4 ulps
    there) as a wrong serving path (tests/flows/test_benchmark_backends.py, ONNX Runtime vs eager)."""
    from tasks.run.scenarios.outputs import _per_root_diff

    ref = torch.tensor([[0.5, 483.0], [0.5, 2.0], [0.5, -300.0]], dtype=torch.float64)
    served = ref + torch.tensor([[0.0, 1.2e-4], [5e-5, 0.0], [0.0, 0.0]], dtype=torch.float64)
    served[2, 1] = -300.0 * (1 + 2e-5)
    present = torch.ones_like(ref, dtype=torch.bool)
    absolute, scaled = _per_root_diff(served, present, ref, present)
    assert absolute.tolist() == pytest.approx([1.2e-4, 5e-5, 6e-3], rel=1e-3)
    assert scaled.tolist() == pytest.approx([1.2e-4 / 483.0, 5e-5, 2e-5], rel=1e-3)
    # at fp32's 1e-5: the 483 row matches, the 5e-5 shift near zero and the 2e-5 relative
    # shift at -300 do not
    assert (scaled <= OUTPUT_TOLERANCE["fp32"]).tolist() == [True, False, False]
