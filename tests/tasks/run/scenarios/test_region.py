"""Every second of the timed region in one named bucket (issue 19), checked with a scripted
clock: stub stages and set-up steps with known seconds give every bucket exactly, and the
buckets add up to ``harness.region_seconds``."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tasks.libraries.reference import side as reference_side
from tasks.measure import keys as K
from tasks.measure.clock import Clock
from tasks.measure.records import CalibrationFit, OfflineReport, Region
from tasks.run.backend_setup import Served
from tasks.run.chain import Chain
from tasks.run.scenarios import region as region_module
from tasks.run.scenarios import request as request_mod
from tasks.run.scenarios.invocation import Timed
from tasks.run.scenarios.latency import LatencyRecord
from tasks.run.scenarios.offline import OfflineRun
from tasks.run.scenarios.region import RegionSteps, run_region
from tasks.run.scenarios.runner import run_requests
from tasks.run.scenarios.workload import Workload
from tasks.sources.files import resolve_sources
from tasks.spec import parse_spec
from tasks.stages.write import PredictionWriter
from tests.scripted_time import ScriptedTime

STAGE_SECONDS = {"retrieve": 1.0, "preprocess": 2.0, "tensorize": 4.0, "compute": 8.0, "calibrate": 16.0, "write": 32.0}
CALL_OVERHEAD = 0.25  # what a Prefect task call costs around its step: orchestration
ENGINE, FIT, BACKEND = 7.0, 5.0, 3.0


class FakeTime(ScriptedTime):
    """Time moves only when a stub says so (or the server scenario sleeps: ``slept``)."""

    def __init__(self) -> None:
        self.slept: list[float] = []
        super().__init__()

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        super().sleep(seconds)

    def runner(self) -> Callable[..., Any]:
        def run(stage: str, step: Callable[[], Any], clock: Clock) -> tuple[Any, float]:
            out = step()
            self.t += STAGE_SECONDS[stage] + CALL_OVERHEAD
            return out, STAGE_SECONDS[stage]

        return run


@pytest.fixture
def stubbed(monkeypatch, shop_spec, many_shop_files):
    """The shop workload on a fake clock, building the engine costing ``ENGINE`` seconds."""
    ft = FakeTime()

    class SlowEngine(reference_side.Engine):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            ft.t += ENGINE
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(reference_side, "Engine", SlowEngine)

    def workload(raw: dict[str, Any]) -> Workload:
        spec = parse_spec(raw)
        chain = Chain(
            spec, resolve_sources(spec, many_shop_files), torch.device("cpu"), clock=ft.clock, run_stage=ft.runner()
        )
        return Workload(chain)

    return ft, workload


@pytest.mark.slow
def test_stub_stages_with_known_seconds_give_every_bucket_exactly(stubbed, shop_spec, tmp_path, monkeypatch):
    ft, workload = stubbed
    shop_spec["run"]["repeats"] = 2
    work = workload(shop_spec)
    fit = work.fit_calibration

    def slow_fit() -> CalibrationFit:
        ft.t += FIT
        return fit()

    monkeypatch.setattr(work, "fit_calibration", slow_fit)
    served = Served(BACKEND, Path("run.ckpt"))

    def backend() -> Served:
        ft.t += BACKEND
        return served

    writer = PredictionWriter(tmp_path / "p.parquet")
    steps = RegionSteps(train=work.train, distributed=False, serving_backend=backend, requests=None, writer=writer)
    ran = run_region(work, steps, train=True, repeats=2)
    writer.abort()
    report, m = ran.scenario, ran.timed.bucket_metrics()
    train = sum(STAGE_SECONDS[s] for s in ("retrieve", "preprocess", "tensorize", "compute"))  # one chunk, one epoch
    passes = 2 * sum(STAGE_SECONDS.values())
    calls = 4 + 2 * 6  # every step a (stub) Prefect task call
    assert isinstance(report, OfflineRun) and report.report.passes == 2
    assert m == {
        K.HARNESS_REGION_SECONDS: train + passes + ENGINE + FIT + BACKEND + calls * CALL_OVERHEAD,
        K.HARNESS_STAGE_SECONDS: train + passes,
        K.HARNESS_ENGINE_SETUP_SECONDS: ENGINE,
        K.HARNESS_CALIBRATION_FIT_SECONDS: FIT,
        K.HARNESS_BACKEND_SETUP_SECONDS: BACKEND,
        K.HARNESS_REQUEST_WAIT_SECONDS: 0.0,
        K.HARNESS_REQUEST_SETTLE_SECONDS: 0.0,
        K.HARNESS_DISTRIBUTED_LAUNCH_SECONDS: 0.0,
        K.HARNESS_ORCHESTRATION_SECONDS: calls * CALL_OVERHEAD,  # the task calls only
    }
    assert m[K.HARNESS_STAGE_SECONDS] == ran.stages.timed_seconds == work.stages.timed_seconds
    # the steps' own reports come back with the region's: training's, the fit's, the backend's
    assert ran.backend is served and ran.training is not None and ran.training.epochs == 1
    assert ran.calibration is not None and ran.calibration.seconds == 0.0  # its FIT seconds came before its span
    timed = Timed(ran, Region(0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0), prefect_calls=calls)
    assert timed.offline is report and timed.latency is None


# What one served request (or batch) costs per step on the fake clock: dyadic, so sums are exact.
SERVE_SECONDS = {stage: seconds / 256 for stage, seconds in STAGE_SECONDS.items()}


def test_a_server_run_names_its_serving_its_idle_waits_and_its_untimed_encoding_fit(
    stubbed, shop_spec, tmp_path, monkeypatch
):
    """Requests run their steps directly (no task call): each step here costs known fake
    seconds, and the server's sleeps are counted by the clock itself. Every bucket is then
    known without the code under test: stage = served calls x the steps' seconds, request_wait
    = what the clock slept, engine_setup = ENGINE, region = how far the clock moved, and
    orchestration = 0 (nothing else moves the clock)."""
    ft, workload = stubbed
    slept = ft.slept
    served_steps: list[str] = []

    def direct(stage: str, step: Callable[[], Any], clock: Clock) -> tuple[Any, float]:
        with clock.measure() as span:
            out = step()
            ft.t += SERVE_SECONDS[stage]
        served_steps.append(stage)
        return out, span.seconds

    monkeypatch.setattr(request_mod, "run_directly", direct)
    shop_spec["run"].update(
        mode="predict",
        scenario="server",
        request={"target_qps": 5.0, "min_requests": 6, "min_duration_s": 0.0, "max_batch": 2},
    )
    work = workload(shop_spec)
    writer = PredictionWriter(tmp_path / "r.parquet")
    steps = RegionSteps(
        train=work.train,
        distributed=False,
        serving_backend=Served,
        requests=lambda: run_requests(work, writer),
        writer=writer,
    )
    t0 = ft.t
    ran = run_region(work, steps, train=False, repeats=1)
    writer.abort()
    moved, latency, region = ft.t - t0, ran.scenario, ran.timed
    assert isinstance(latency, LatencyRecord) and latency.requests == 6
    timed = Timed(ran, Region(0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0), prefect_calls=1)
    assert timed.latency is latency and timed.offline is None and ran.training is None and ran.calibration is None
    calls = served_steps.count("write")  # the cold request and every batch, each through every step
    assert calls >= 2 and served_steps == list(STAGE_SECONDS) * calls
    served = calls * sum(SERVE_SECONDS.values())
    assert sum(slept) > 0  # at 5 QPS the server does wait for arrivals
    m = region.bucket_metrics()
    assert m[K.HARNESS_ENGINE_SETUP_SECONDS] == ENGINE
    assert m[K.HARNESS_STAGE_SECONDS] == pytest.approx(served, abs=1e-9)
    assert m[K.HARNESS_REQUEST_WAIT_SECONDS] == pytest.approx(sum(slept), abs=1e-9)
    assert m[K.HARNESS_REGION_SECONDS] == pytest.approx(moved, abs=1e-9)
    assert moved == pytest.approx(ENGINE + served + sum(slept), abs=1e-9)
    assert m[K.HARNESS_ORCHESTRATION_SECONDS] == pytest.approx(0.0, abs=1e-9)
    assert m[K.HARNESS_CALIBRATION_FIT_SECONDS] == m[K.HARNESS_BACKEND_SETUP_SECONDS] == 0.0


BOOK_SECONDS = 1 / 64  # what one served call's bookkeeping (Workload.account) costs on the fake clock


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["server", "single_stream"])
def test_a_request_runs_bookkeeping_is_its_own_bucket(stubbed, shop_spec, tmp_path, monkeypatch, scenario):
    """The served calls' bookkeeping (``RequestPath.settle``) costs known fake seconds per
    call: it is ``harness.request_settle_seconds`` exactly, and every second of the region is
    in one bucket (orchestration 0: nothing else moves the clock). On the old code it had no
    bucket of its own and was counted as orchestration (issue 43 item 10)."""
    ft, workload = stubbed
    slept = ft.slept

    def direct(stage: str, step: Callable[[], Any], clock: Clock) -> tuple[Any, float]:
        with clock.measure() as span:
            out = step()
            ft.t += SERVE_SECONDS[stage]
        return out, span.seconds

    account = Workload.account

    def slow_account(self: Workload, *args: Any, **kwargs: Any) -> Any:
        ft.t += BOOK_SECONDS
        return account(self, *args, **kwargs)

    monkeypatch.setattr(request_mod, "run_directly", direct)
    monkeypatch.setattr(Workload, "account", slow_account)
    shop_spec["run"].update(
        mode="predict",
        scenario=scenario,
        request={"target_qps": 5.0, "min_requests": 6, "min_duration_s": 0.0, "max_batch": 2},
    )
    work = workload(shop_spec)
    writer = PredictionWriter(tmp_path / "r.parquet")
    steps = RegionSteps(
        train=work.train,
        distributed=False,
        serving_backend=Served,
        requests=lambda: run_requests(work, writer),
        writer=writer,
    )
    t0 = ft.t
    ran = run_region(work, steps, train=False, repeats=1)
    writer.abort()
    moved, latency, region = ft.t - t0, ran.scenario, ran.timed
    assert isinstance(latency, LatencyRecord) and latency.requests >= 6
    calls = ran.stages.stage("predict", "write").calls  # every served call, the cold one included
    served = calls * sum(SERVE_SECONDS.values())
    m = region.bucket_metrics()
    assert m[K.HARNESS_REQUEST_SETTLE_SECONDS] == pytest.approx(calls * BOOK_SECONDS, abs=1e-9)
    assert m[K.HARNESS_REQUEST_WAIT_SECONDS] == pytest.approx(sum(slept), abs=1e-9)
    assert m[K.HARNESS_STAGE_SECONDS] == pytest.approx(served, abs=1e-9)
    assert moved == pytest.approx(ENGINE + served + sum(slept) + calls * BOOK_SECONDS, abs=1e-9)
    assert m[K.HARNESS_REGION_SECONDS] == pytest.approx(moved, abs=1e-9)
    assert m[K.HARNESS_ORCHESTRATION_SECONDS] == pytest.approx(0.0, abs=1e-9)
    named = sum(v for k, v in m.items() if k not in (K.HARNESS_REGION_SECONDS, K.HARNESS_ORCHESTRATION_SECONDS))
    assert named == pytest.approx(m[K.HARNESS_REGION_SECONDS], abs=1e-9)


def test_collector_pauses_inside_the_region_are_timed_and_objects_before_it_frozen(
    stubbed, shop_spec, tmp_path, monkeypatch
):
    """One collection inside the region, made to last 0.5 s on the fake clock: the region
    reports exactly one collection of 0.5 s, its wall time holds those seconds (here in
    orchestration: the pass is no stage), and what was alive before it is frozen inside."""
    ft, workload = stubbed
    shop_spec["run"]["mode"] = "predict"
    work = workload(shop_spec)
    frozen_inside: list[int] = []

    def slow_collection(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop":  # before the region's own callback reads the clock
            ft.t += 0.5

    def predict(work: object, writer: object, repeats: int) -> OfflineRun:  # the passes: one collection
        frozen_inside.append(gc.get_freeze_count())
        gc.collect()
        return OfflineRun(OfflineReport(), None)

    monkeypatch.setattr(region_module, "run_offline", predict)
    steps = RegionSteps(
        train=work.train,
        distributed=False,
        serving_backend=Served,
        requests=None,
        writer=PredictionWriter(tmp_path / "p.parquet"),
    )
    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection may add one of its own
    gc.callbacks.append(slow_collection)
    try:
        before = gc.get_freeze_count()
        region = run_region(work, steps, train=False, repeats=1).timed
    finally:
        gc.callbacks.remove(slow_collection)
        if was_enabled:
            gc.enable()
    assert region.gc.collections == 1
    assert region.gc.seconds == 0.5
    assert region.gc.metrics() == {K.HARNESS_REGION_GC_SECONDS: 0.5, K.HARNESS_REGION_GC_COLLECTIONS: 1.0}
    assert region.orchestration_seconds == 0.5
    assert frozen_inside[0] > before + 1000  # the imports and the workload, frozen out of the pass
    assert gc.get_freeze_count() == before  # and thawed when the region ends
