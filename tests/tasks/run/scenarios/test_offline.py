"""The offline scenario. Cold start (issue 19): the calibration fit must not compile (and so
warm) the graphs the predict path runs, so predict's first call still includes their
compilation. Its report (issue 42 item 2): a scripted run's passes give every figure exactly."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tasks.libraries.reference import side as reference_side
from tasks.measure import keys as K
from tasks.measure.clock import Clock
from tasks.measure.records import RunResult
from tasks.run.backend_setup import Served
from tasks.run.chain import Chain
from tasks.run.scenarios.offline import OfflineRun, predict_pass
from tasks.run.scenarios.region import RegionSteps, run_region
from tasks.run.scenarios.workload import Workload
from tasks.sources.files import resolve_sources
from tasks.spec import parse_spec
from tasks.stages import compute as compute_stage
from tasks.stages.write import PredictionWriter
from tests.scripted_time import ScriptedTime

pytestmark = pytest.mark.slow  # a real compile of the calibration fit and the first predict; a trained shop model


def test_calibration_fit_compiles_nothing_so_predict_first_call_compiles(shop_spec, many_shop_files, tmp_path):
    shop_files = many_shop_files
    raw = copy.deepcopy(shop_spec)
    # Dynamo with the eager backend: every region really goes through Dynamo (graphs counted)
    # at a fraction of Inductor's cost.
    raw["run"]["compile"] = {"encoders": True, "pools": True, "backend": "eager", "dynamic": True}
    raw["run"]["batch_size"] = 64  # one batch per step: no shape-driven recompiles
    raw["task"]["validation_fraction"] = 0.3
    spec = parse_spec(raw)
    work = Workload(Chain(spec, resolve_sources(spec, shop_files), torch.device("cpu")))
    work.list_keys()
    work.train()
    before_fit = compute_stage.compiled_frames()
    fit = work.fit_calibration()
    assert compute_stage.compiled_frames() == before_fit, "the calibration fit compiled graphs"
    assert fit.rows > 0  # it did fit, on eager regions
    writer = PredictionWriter(tmp_path / "p.parquet")
    before_predict = compute_stage.compiled_frames()
    predict_pass(work, writer, 0)
    writer.abort()
    # predict's own first call compiled its eval graphs: the figure includes that compile
    assert compute_stage.compiled_frames() > before_predict
    # calibration quality is scored on the held-out cells the fit did not use, all of them
    report_rows = work.chain.calibration.rows
    assert report_rows > 0 and fit.rows + report_rows == work.chain.engine.quality.metrics()["rows"]


# Dyadic seconds on a scripted clock, so every sum is exact; compute's stage seconds are its batches'.
STAGE_COST = {"retrieve": 1.0, "preprocess": 2.0, "tensorize": 4.0, "compute": 0.0, "calibrate": 0.5, "write": 0.25}
PREDICT_BATCH = 0.125
ROWS, BATCH = 40, 4  # many_shop_files: 40 customers, run.batch_size 4, one chunk, warmup_batches 0


def test_the_offline_report_of_a_scripted_run_holds_the_known_figures(
    shop_spec, many_shop_files, tmp_path, monkeypatch
):
    """Three passes on a scripted clock: each stage step costs ``STAGE_COST``, each predict
    batch ``PREDICT_BATCH``, nothing else moves the clock. The report ``run_region`` returns
    holds every figure worked out by hand, and ``RunResult.metrics()`` keys them as before."""
    ft = ScriptedTime()

    class Stubbed(reference_side.Engine):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            step = self.backend.step

            def predict_step(*a: Any, **k: Any) -> Any:
                ft.t += PREDICT_BATCH
                return step(*a, **k)

            self.backend.step = predict_step  # type: ignore[method-assign]

    monkeypatch.setattr(reference_side, "Engine", Stubbed)

    def runner(stage: str, step: Callable[[], Any], clock: Clock) -> tuple[Any, float]:
        with clock.measure() as span:
            out = step()
            ft.t += STAGE_COST[stage]
        return out, span.seconds

    shop_spec["run"].update(repeats=3, check_outputs=True)
    spec = parse_spec(shop_spec)
    chain = Chain(spec, resolve_sources(spec, many_shop_files), torch.device("cpu"), clock=ft.clock, run_stage=runner)
    work = Workload(chain)
    listed: dict[str, int] = {}  # the predict table's bytes before the passes (the key listing's)
    list_keys = work.list_keys

    def listing() -> None:
        list_keys()
        listed.update({name: st.bytes for name, st in work.stages["predict"].items()})

    monkeypatch.setattr(work, "list_keys", listing)
    writer = PredictionWriter(tmp_path / "p.parquet")
    steps = RegionSteps(train=work.train, distributed=False, serving_backend=Served, requests=None, writer=writer)
    ran = run_region(work, steps, train=True, repeats=3)
    writer.abort()
    run = ran.scenario
    assert isinstance(run, OfflineRun)
    report = run.report

    batches = math.ceil(ROWS / BATCH)  # 10 per pass, one chunk
    pass_seconds = sum(STAGE_COST.values()) + batches * PREDICT_BATCH  # 7.75 + 1.25 = 9.0
    assert (report.rows_predicted, report.passes) == (3 * ROWS, 3)
    assert report.rows_per_s == (ROWS / pass_seconds,) * 3  # 40 / 9.0 each
    # pass 0's first batch is the first call (warmup_batches 0): 9 steady batches, 36 rows in
    # 1.125 s; passes 1 and 2: 10 steady batches, 40 rows in 1.25 s. 32 rows/s each.
    assert report.steady_rows_per_s == (BATCH / PREDICT_BATCH,) * 3
    # passes 1 and 2 only: each stage's seconds twice (compute: its 10 batches)
    warm_seconds = {s: 2 * (c if s != "compute" else batches * PREDICT_BATCH) for s, c in STAGE_COST.items()}
    assert {s: w.seconds for s, w in report.warm_stages.items()} == warm_seconds
    # bytes: every pass reads and tensorizes the same rows, so the warm passes hold two passes' worth
    table = {s.name: s for s in ran.stages.predict}
    assert list(report.warm_stages) == list(table)
    for name, warm in report.warm_stages.items():
        moved = table[name].bytes - listed[name]  # three passes' bytes
        assert moved % 3 == 0 and warm.bytes == (2 * moved // 3 if moved else None), name
    assert any(w.bytes for w in report.warm_stages.values())
    assert run.served_outputs is not None and len(run.served_outputs.keys) == 1  # the last pass's chunk

    # The stage table the region returns: every predict stage 3 passes of its cost over the 40
    # rows (compute: its batches; retrieve also listed the keys, one more call of no rows and no
    # seconds on this clock); one training epoch through retrieve..compute (compute: a stub
    # forward of no seconds), over every root row but compute's, the training rows.
    for name, cost in STAGE_COST.items():
        st = ran.stages.stage("predict", name)
        seconds = 3 * (cost if name != "compute" else batches * PREDICT_BATCH)
        assert (st.seconds, st.rows, st.calls) == (seconds, 3 * ROWS, 3 + (name == "retrieve")), name
    assert [s.name for s in ran.stages.train] == ["retrieve", "preprocess", "tensorize", "compute"]
    assert [(s.seconds, s.rows, s.calls) for s in ran.stages.train[:3]] == [(1.0, 40, 1), (2.0, 40, 1), (4.0, 40, 1)]
    assert ran.stages.stage("train", "compute").calls == 1 and 0 < ran.stages.stage("train", "compute").rows < ROWS
    assert ran.stages.seconds("predict") == 3 * pass_seconds
    assert ran.timed.stage_seconds == ran.stages.timed_seconds == 3 * pass_seconds + 7.0

    # The record keys them as before: the reports in RunResult.
    m = RunResult(ran.stages, offline=report).metrics()
    e2e = 3 * pass_seconds  # the key listing cost nothing on this clock
    assert m[K.E2E_PREDICT_SECONDS] == e2e
    assert m[K.E2E_PREDICT_ROWS] == m[K.DATA_ROWS_PREDICTED] == 120.0
    assert m[K.E2E_PREDICT_ROWS_PER_S] == 120 / e2e
    assert m[K.E2E_PREDICT_PASSES] == 3.0
    assert m[K.median(K.E2E_PREDICT_ROWS_PER_S)] == ROWS / pass_seconds  # passes 1 and 2
    assert m[K.median(K.STEADY_ROWS_PER_S)] == 32.0
    assert m[K.REPEATS_MEASURED] == 2.0
    assert not any(k.endswith(".ci_low") for k in m)  # 2 samples support no interval
    for name, seconds in warm_seconds.items():
        assert m[K.stage_warm_seconds(name)] == seconds
    warm_bytes = {name: float(w.bytes) for name, w in report.warm_stages.items() if w.bytes is not None}
    assert {k: v for k, v in m.items() if k.endswith(".warm_bytes")} == {
        K.stage_warm_bytes(name): b for name, b in warm_bytes.items()
    }
