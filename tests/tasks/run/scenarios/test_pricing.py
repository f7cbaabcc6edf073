"""Know the price before paying it (issue 41 item 5), on a scripted clock: stub stages and
batches with known seconds give the projection exactly (tasks/run/scenarios/pricing.py over
tasks/measure/projection.py), ``run.max_minutes`` stops the run at the first projection, before
the work it prices is spent, and the progress count sees every batch against a total known
before the phase starts."""

from __future__ import annotations

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
from tasks.run.scenarios.offline import OfflineRun
from tasks.run.scenarios.pricing import STEADY_TO_PRICE
from tasks.run.scenarios.region import RegionSteps, run_region
from tasks.run.scenarios.workload import Workload
from tasks.runtime import progress
from tasks.runtime.errors import UserError
from tasks.sources.files import resolve_sources
from tasks.spec import parse_spec
from tasks.stages.write import PredictionWriter
from tests.scripted_time import ScriptedTime

pytestmark = pytest.mark.slow  # each test trains and predicts the shop model (6-10 s here)

# Dyadic seconds, so every sum is exact. compute's stage cost is its batches'.
STAGE_COST = {"retrieve": 1.0, "preprocess": 2.0, "tensorize": 4.0, "compute": 0.0, "calibrate": 0.5, "write": 0.25}
TRAIN_BATCH, PREDICT_BATCH = 0.5, 0.125
ROWS, BATCH = 40, 4  # many_shop_files: 40 customers, run.batch_size 4


@pytest.fixture
def stubbed(monkeypatch, shop_spec, many_shop_files, tmp_path):
    """The shop workload on a scripted clock: each stage step costs ``STAGE_COST``, each
    training batch ``TRAIN_BATCH`` and each predict batch ``PREDICT_BATCH``; nothing else moves
    the clock. Returns ``run(spec_changes) -> (workload, record)`` after the whole timed region."""
    ft = ScriptedTime()

    class Stubbed(reference_side.Engine):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            forward, step = self.forward, self.backend.step

            def train_forward(*a: Any, **k: Any) -> Any:
                ft.t += TRAIN_BATCH
                return forward(*a, **k)

            def predict_step(*a: Any, **k: Any) -> Any:
                ft.t += PREDICT_BATCH
                return step(*a, **k)

            self.forward = train_forward
            self.backend.step = predict_step  # type: ignore[method-assign]

    monkeypatch.setattr(reference_side, "Engine", Stubbed)

    def runner(stage: str, step: Callable[[], Any], clock: Clock) -> tuple[Any, float]:
        with clock.measure() as span:
            out = step()
            ft.t += STAGE_COST[stage]
        return out, span.seconds

    def run(**changes: Any) -> tuple[Workload, RunResult]:
        raw = dict(shop_spec)
        raw["run"] = {**raw["run"], "epochs": 2, "repeats": 2, "output_dir": str(tmp_path / "out"), **changes}
        spec = parse_spec(raw)
        chain = Chain(
            spec, resolve_sources(spec, many_shop_files), torch.device("cpu"), clock=ft.clock, run_stage=runner
        )
        work = Workload(chain)
        writer = PredictionWriter(tmp_path / "p.parquet")
        steps = RegionSteps(train=work.train, distributed=False, serving_backend=Served, requests=None, writer=writer)
        try:
            ran = run_region(work, steps, train=spec.run.mode == "train+predict", repeats=spec.run.repeats)
        finally:
            writer.abort()
        assert isinstance(ran.scenario, OfflineRun)
        # the region's reports into the record, as the flow does
        result = RunResult(ran.stages, offline=ran.scenario.report, training=ran.training, projection=ran.projections)
        return work, result

    return ft, run


def test_the_projection_is_exact_on_stub_stages_with_known_seconds(stubbed):
    ft, run = stubbed
    work, result = run()
    assert result.projection is not None
    made = result.projection.made
    assert [p.at for p in made] == ["train", "predict"]
    trained = work.stages["train"]["compute"].rows // 2  # training rows of one epoch
    train_batches, predict_batches = 2 * math.ceil(trained / BATCH), 2 * math.ceil(ROWS / BATCH)
    prepare = STAGE_COST["retrieve"] + STAGE_COST["preprocess"] + STAGE_COST["tensorize"]
    priced_after = 1 + STEADY_TO_PRICE  # the first call, then warm-up 0, then the steady batches

    first = made[0]  # after training's first steady batches: one chunk, tensors kept between epochs
    assert first.elapsed_seconds == prepare + priced_after * TRAIN_BATCH
    train, predict = first.phases
    assert (train.batches_left, train.seconds_per_batch, train.stage_seconds) == (
        train_batches - priced_after,
        TRAIN_BATCH,
        0.0,  # retrieve..tensorize done once for every epoch
    )
    # predict not run yet: at training's steady batch, and its retrieve..tensorize per row, twice
    assert (predict.batches_left, predict.seconds_per_batch) == (predict_batches, TRAIN_BATCH)
    assert predict.stage_seconds == 2 * prepare and predict.rows_left == 2 * ROWS
    assert first.total_seconds == prepare + train_batches * TRAIN_BATCH + predict_batches * TRAIN_BATCH + 2 * prepare
    assert first.exact  # one chunk: its training rows were known before its first batch

    again = made[1]  # re-priced at predict's own steady batches, in pass 0
    train_spent = prepare + train_batches * TRAIN_BATCH
    assert again.elapsed_seconds == train_spent + prepare + priced_after * PREDICT_BATCH
    (p,) = again.phases
    assert (p.batches_left, p.seconds_per_batch) == (predict_batches - priced_after, PREDICT_BATCH)
    assert p.stage_seconds == prepare  # pass 1's retrieve..tensorize; calibrate and write not measured yet
    region = ft.t
    assert region == train_spent + 2 * (prepare + STAGE_COST["calibrate"] + STAGE_COST["write"]) + (
        predict_batches * PREDICT_BATCH
    )
    # what the re-projection leaves out is exactly the two passes' calibrate and write
    assert region - again.total_seconds == 2 * (STAGE_COST["calibrate"] + STAGE_COST["write"])
    m = result.metrics()
    assert m[K.RUN_PROJECTED_SECONDS] == first.total_seconds
    assert m[K.RUN_PROJECTED_AT_SECONDS] == first.elapsed_seconds
    assert m[K.RUN_PROJECTED_EXACT] == 1.0
    assert m[K.RUN_REPROJECTED_SECONDS] == again.total_seconds


def test_max_minutes_stops_at_the_first_projection_before_the_work_it_prices(stubbed):
    ft, run = stubbed
    # projected: 7 + 2*ceil(train/4)*0.5 + 20*0.5 + 14 s; a limit of 0.3 min (18 s) is passed
    with pytest.raises(UserError) as err:
        run(max_minutes=0.3)
    prepare = STAGE_COST["retrieve"] + STAGE_COST["preprocess"] + STAGE_COST["tensorize"]
    assert ft.t == prepare + (1 + STEADY_TO_PRICE) * TRAIN_BATCH  # stopped at the projection
    msg = str(err.value)
    assert err.value.exit_code == 2
    for needed in ("run.max_minutes is 0.3", "projected", "run.epochs 2", "run.batch_size 4", "run.repeats 2"):
        assert needed in msg, needed
    assert "orders.max_length 2" in msg and "lines.max_length 3" in msg and "40 root rows" in msg


def test_a_limit_above_the_projection_lets_the_run_finish(stubbed):
    ft, run = stubbed
    _, result = run(max_minutes=10.0)
    assert result.offline is not None and result.offline.passes == 2
    assert result.training is not None and result.training.epochs == 2
    assert result.projection is not None and result.projection.made[0].total_seconds < 600


def test_the_count_sees_every_batch_of_a_total_known_before_the_phase(stubbed):
    ft, run = stubbed
    seen: list[progress.Count] = []
    totals: list[tuple[str, int | None, bool]] = []

    def listen(event: str, info: dict[str, Any]) -> None:
        if event == "count":
            seen.append(info["count"])
            totals.append((info["count"].phase, info["count"].total, info["count"].exact))

    unsubscribe = progress.subscribe(listen)
    try:
        work, _ = run(chunk_rows=16)  # three chunks: training rows known chunk by chunk
    finally:
        unsubscribe()
    train, predict = seen
    trained = work.stages["train"]["compute"].rows
    # every batch counted, and each count's last total is the batches that ran
    assert (train.done, train.rows) == (work.chain.engine.train_timings.updates, trained)  # type: ignore[union-attr]
    assert train.total == train.done and train.exact
    assert totals[0][2] is False  # before any chunk was split: an estimate, said so
    assert predict.total == 2 * sum(math.ceil(n / BATCH) for n in (16, 16, 8)) == predict.done
    assert totals[1] == ("predict", predict.total, True)  # known before the first predict batch
    assert predict.rows == 2 * ROWS
    assert progress._count is None  # closed with the region


def test_without_a_listener_nothing_is_counted(stubbed):
    ft, run = stubbed
    assert not progress.listening()
    _, result = run()
    assert progress._count is None
    assert result.projection is not None and result.projection.made  # the projection is the run's, listener or not


def _request_pricing(ft: ScriptedTime, scenario: str, **request: Any) -> Any:
    """A ``Pricing`` over a stand-in workload: a request run prices only from its requests."""
    from types import SimpleNamespace

    from tasks.run.scenarios.pricing import Pricing
    from tasks.spec.run import RunSettings

    run = RunSettings(scenario=scenario, mode="predict", request=request)  # type: ignore[arg-type]
    work = SimpleNamespace(spec=SimpleNamespace(run=run), chain=SimpleNamespace(engine=None))
    return Pricing(work, ft.clock)  # type: ignore[arg-type]


def test_a_single_stream_run_is_priced_from_its_first_steady_requests_with_a_scripted_clock():
    from tasks.run.scenarios import single_stream

    ft = ScriptedTime()
    ft.t = 2.0  # the region so far: 2 s before the requests
    pricing = _request_pricing(ft, "single_stream", min_requests=10, min_duration_s=1.0)

    def serve(keys: Any) -> dict[str, float]:
        ft.t += 0.25
        return {"compute": 0.25}

    keys = iter([[1]] * 20)
    single_stream.run(
        serve,
        keys,
        ft.clock,
        min_requests=10,
        min_duration_s=1.0,
        on_served=pricing.requests_served,  # type: ignore[arg-type]
    )
    (p,) = pricing.projections.made
    # priced after 3 steady requests (0.75 s into the schedule; the cold one before it): 7 more
    # at 0.25 s, longer than the 0.25 s the minimum duration still needs
    assert p.at == "single_stream" and p.elapsed_seconds == 2.0 - 2.0 + 0.25 + 0.75
    assert p.phases[0].schedule_seconds == 7 * 0.25
    assert p.total_seconds == ft.t - 2.0  # exact: the run took what was projected


def test_a_server_run_is_priced_to_its_schedules_last_arrival():
    ft = ScriptedTime()
    pricing = _request_pricing(ft, "server", min_requests=8, min_duration_s=0.0, target_qps=4.0)
    pricing.begin_requests(5.0, 8)
    ft.t = 1.5
    for elapsed in (0.5, 1.0, 1.5):
        pricing.requests_served(1, 1, elapsed)
    (p,) = pricing.projections.made
    assert (p.elapsed_seconds, p.phases[0].schedule_seconds, p.total_seconds) == (1.5, 3.5, 5.0)
