"""What a served request counts (figures, stage table, calibration quality: ``report_mask``
hashes its keys) runs outside every request's latency span (issue 35).

A scripted clock moves only when that bookkeeping runs: 1 s per ``Workload.account`` call and
1 s per ``report_mask`` call, every other read returns the same time. So a request's latency
holds bookkeeping seconds or none, whatever the host does. On the old code every single_stream
request's latency was 2.0 s (and the cold one's) and a server request's latency held 2 s that
no step or queue accounted for (``latency.step_share.other`` 1.0 at 1 QPS with no queueing)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks.measure import keys as K
from tasks.measure.clock import Clock
from tasks.run import chain as chain_module
from tasks.run.chain import Chain
from tasks.run.scenarios.runner import run_requests
from tasks.run.scenarios.workload import Workload
from tasks.sources.files import resolve_sources
from tasks.spec import parse_spec
from tasks.stages.write import PredictionWriter

pytestmark = pytest.mark.slow  # a trained engine and a real request path per test


class BookkeepingTime:
    """The scripted clock: ``t`` moves by 1 s per bookkeeping call and by what is slept."""

    def __init__(self) -> None:
        self.t, self.calls = 0.0, 0
        self.clock = Clock(None, now=lambda: self.t, sleep=self.sleep)

    def sleep(self, seconds: float) -> None:
        self.t += max(seconds, 0.0)

    def costs_a_second(self, fn):
        def wrapped(*args, **kwargs):
            self.t += 1.0
            self.calls += 1
            return fn(*args, **kwargs)

        return wrapped


def _served(shop_spec, many_shop_files, tmp_path, monkeypatch, scenario: str):
    shop_spec["model"] = {"d_model": 16, "layers": 1, "heads": 2}
    shop_spec["run"]["scenario"] = scenario
    shop_spec["run"]["request"] = {"min_requests": 6, "min_duration_s": 0, "target_qps": 0.2, "max_batch": 1}
    spec = parse_spec(shop_spec)
    bt = BookkeepingTime()
    work = Workload(Chain(spec, resolve_sources(spec, many_shop_files), torch.device("cpu"), clock=bt.clock))
    work.list_keys()
    work.train()
    monkeypatch.setattr(chain_module, "report_mask", bt.costs_a_second(chain_module.report_mask))
    monkeypatch.setattr(Workload, "account", bt.costs_a_second(Workload.account))
    writer = PredictionWriter(tmp_path / "requests.parquet")
    rec = run_requests(work, writer)
    writer.abort()
    return work, rec, bt


def test_single_stream_latency_holds_no_bookkeeping(shop_spec, many_shop_files, tmp_path, monkeypatch):
    work, rec, bt = _served(shop_spec, many_shop_files, tmp_path, monkeypatch, "single_stream")
    calls = rec.requests + 1  # the cold one too
    assert rec.requests >= 6
    # the bookkeeping ran for every call: its figures are there, and it took its scripted time
    assert work.stages["predict"]["compute"].calls == calls
    assert work.data.rows_served == calls and len(rec.scored_keys) == calls
    assert work.chain.calibration.metrics(), "held-out requests feed the calibration quality"
    assert bt.calls == 2 * calls  # account + report_mask per call (every request is held out)
    # ...and none of it inside a request's latency
    assert rec.first_latency_s == 0.0
    assert rec.latency_s == [0.0] * rec.requests
    assert rec.duration_s == pytest.approx(2.0 * rec.requests)  # the scenario's wall holds it


def test_server_latency_holds_no_bookkeeping(shop_spec, many_shop_files, tmp_path, monkeypatch):
    work, rec, bt = _served(shop_spec, many_shop_files, tmp_path, monkeypatch, "server")
    calls = rec.requests + 1
    assert work.stages["predict"]["compute"].calls == calls and bt.calls == 2 * calls
    m = rec.metrics()
    # every request's latency is its queue and steps (both 0 on this clock) or a late issue
    late = np.asarray(rec.lateness_s)
    assert np.asarray(rec.latency_s) == pytest.approx(np.asarray(rec.queue_s))
    assert m[K.LATENCY_STEP_SHARE_OTHER] == 0.0
    # at 0.2 QPS the 2 s of bookkeeping fit in the idle gaps, but not always: the ones that
    # did not show as issue lateness, never as service
    assert (late >= 0).all()
