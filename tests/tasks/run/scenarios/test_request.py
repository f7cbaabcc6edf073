"""Request-scenario figures whose answers are exact on hand-made inputs.

- service and response throughput are named apart: rows per second of service time
  (``latency.rows_per_service_s``) vs rows per wall second of the scenario
  (``latency.rows_per_wall_s``); the stage table's e2e once stood for both;
- ``data.padded_coords`` is per served request (it was every request's coordinates divided by
  ``run.repeats``);
- ``quality.delta_vs_reference`` compares the same rows: the reference scores every served
  call's rows, repeats and the cold request included, as the request quality does (it scored
  each held-out row once, against a request quality over repeated rows)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks.measure import keys as K
from tasks.measure.clock import Clock
from tasks.run.scenarios import server, single_stream

pytestmark = pytest.mark.slow  # a real request path over the shop workload per test


class FakeTime:
    """A clock that moves only when a call is served (``cost`` s) or the driver sleeps."""

    def __init__(self, cost: float) -> None:
        self.t, self.cost = 0.0, cost
        self.clock = Clock(None, now=lambda: self.t, sleep=self.sleep)

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    def serve(self, keys: np.ndarray) -> dict[str, float]:
        self.t += self.cost
        return {"retrieve": self.cost / 4, "compute": self.cost / 2, "write": self.cost / 4}


def test_server_service_and_wall_throughput_are_apart():
    ft = FakeTime(1.0)
    keys = np.arange(8).reshape(4, 2)  # two roots per request
    # three arrive together (one batch of 6 rows, 1 s), the last alone at 3.0 s (2 rows, 1 s)
    rec = server.run(
        ft.serve,
        np.array([0.0, 0.01, 0.02, 3.0]),
        keys,
        ft.clock,
        max_batch=3,
        max_wait_s=0.05,
        cold_keys=np.array([9, 10]),
    )
    m = rec.metrics()
    assert m[K.LATENCY_SERVICE_SECONDS] == pytest.approx(2.0)  # each batch once; the cold one apart
    assert m[K.LATENCY_ROWS_PER_SERVICE_S] == pytest.approx(8 / 2.0)
    assert m["latency.duration_seconds"] == pytest.approx(4.0)  # idle until 3.0, served until 4.0
    assert m[K.LATENCY_ROWS_PER_WALL_S] == pytest.approx(8 / 4.0)
    assert rec.served_requests == 5


def test_single_stream_service_and_wall_throughput():
    ft = FakeTime(0.5)
    rec = single_stream.run(
        ft.serve, iter(np.arange(20).reshape(10, 2)), ft.clock, min_requests=4, min_duration_s=0, roots=2
    )
    m = rec.metrics()
    assert rec.requests == 4 and rec.served_requests == 5
    assert m[K.LATENCY_ROWS_PER_SERVICE_S] == pytest.approx(8 / 2.0)
    assert m[K.LATENCY_ROWS_PER_WALL_S] == pytest.approx(8 / 2.0)  # no queue, no idle: equal
    for key in (K.LATENCY_ROWS_PER_SERVICE_S, K.LATENCY_ROWS_PER_WALL_S, K.LATENCY_SERVICE_SECONDS):
        assert K.documented(key)


@pytest.fixture
def served(shop_spec, many_shop_files, tmp_path):
    """A trained tiny engine and a single_stream scenario over the real request path: a cold
    request, then the same held-out key asked for again and again, then two others."""
    from tasks.run.chain import Chain
    from tasks.run.scenarios.request import RequestPath
    from tasks.run.scenarios.schedule import validation_keys
    from tasks.run.scenarios.workload import Workload
    from tasks.sources.files import resolve_sources
    from tasks.spec import parse_spec
    from tasks.stages.write import PredictionWriter

    shop_spec["model"] = {"d_model": 16, "layers": 1, "heads": 2}
    shop_spec["run"]["scenario"] = "single_stream"
    spec = parse_spec(shop_spec)
    work = Workload(Chain(spec, resolve_sources(spec, many_shop_files), torch.device("cpu")))
    work.list_keys()
    work.train()
    pool = validation_keys(np.concatenate(work.chunks), spec, work.chain.sources)
    assert len(pool) >= 3
    stream = [pool[:1]] * 5 + [pool[1:2], pool[2:3]]  # cold + four repeats of one key + two others
    writer = PredictionWriter(tmp_path / "requests.parquet")
    path = RequestPath(work, writer)
    rec = single_stream.run(path, iter(stream), work.chain.clock, min_requests=6, min_duration_s=0, settle=path.settle)
    rec.scored_keys = path.scored_keys
    writer.abort()
    return spec, work, rec


def test_padded_coords_are_per_served_request(served):
    from tasks.measure.records import batch_coordinate_metrics

    spec, work, rec = served
    engine = work.chain.engine
    assert rec.served_requests == 7 and len(engine.batch_coords) == 7  # one batch per request (1 root)
    m = batch_coordinate_metrics(engine.batch_coords, rec.served_requests, len(engine.batch_shapes))
    assert m[K.DATA_PADDED_COORDS] == pytest.approx(sum(q for _, q in engine.batch_coords) / 7)
    # the same key five times: five equal batches; the figure is one request's, not a pass total
    assert len({q for _, q in engine.batch_coords[:5]}) == 1
    assert m[K.DATA_PADDED_COORDS] < sum(q for _, q in engine.batch_coords) / spec.run.repeats


def test_delta_vs_reference_compares_the_rows_the_requests_scored(served):
    from tasks.backends.checkpoint import LoadedCheckpoint
    from tasks.run.reference_pass import quality_delta, reference_quality

    spec, work, rec = served
    engine, chain = work.chain.engine, work.chain
    ref = LoadedCheckpoint(
        model=engine.model.state_dict(),
        schema=engine.schema,
        encoding=chain.encoding,
        optimizer=None,
        temperature=1.0,
        load=None,
    )
    run_quality = engine.quality.metrics()
    same = reference_quality(
        spec, ref, len(work.chunks), work.prepare_untimed, torch.device("cpu"), rec.scored_keys, chain.prepare_untimed
    )
    # the reference is the served weights themselves: over the same rows, nothing differs
    for name, value in run_quality.items():
        assert same[name] == pytest.approx(value, abs=1e-6), name
    delta = quality_delta(engine.quality.headline, run_quality, same)
    assert delta[K.QUALITY_DELTA_VS_REFERENCE] == pytest.approx(0.0, abs=1e-6)
    # every held-out row once (the old reference pass) is another set of rows: this setup tells them apart
    once = reference_quality(spec, ref, len(work.chunks), work.prepare_untimed, torch.device("cpu"))
    assert any(once[k] != pytest.approx(v, abs=1e-6) for k, v in run_quality.items())


def test_request_stage_bytes_are_every_served_requests(served):
    """stage.<stage>.predict.bytes of a request run count each served request's bytes (they
    counted none: only the key listing's read reached the predict retrieve)."""
    spec, work, rec = served
    pool_keys = [k for k in rec.scored_keys]
    expected = {"retrieve": 0, "preprocess": 0, "tensorize": 0}
    for keys in pool_keys:
        for stage, n in work.chain.prepare(keys, lambda *_: None).stage_bytes().items():
            expected[stage] += n
    m = work.stages.report().metrics()
    from tasks.stages.retrieve import list_root_keys

    _, listing = list_root_keys(spec, work.chain.sources)  # the key listing's read, charged to predict
    assert m["stage.tensorize.predict.bytes"] == expected["tensorize"] > 0
    assert m["stage.preprocess.predict.bytes"] == expected["preprocess"] > 0
    assert m["stage.retrieve.predict.bytes"] == pytest.approx(expected["retrieve"] + listing)
