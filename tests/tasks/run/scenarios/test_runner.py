"""The serving thread policy (run.request.intra_op_threads): requests are served with the
policy's torch intra-op thread count, the cold request included, and the run's own count is
back afterwards. Two intra-op threads made the server's low-load latency (tasks/run/scenarios/
README.md, Low load); before the policy the requests ran with whatever the run had."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from tasks.measure import keys as K
from tasks.run.chain import Chain
from tasks.run.scenarios.runner import run_requests
from tasks.run.scenarios.workload import Workload
from tasks.runtime.threads import intra_op_threads
from tasks.sources.files import resolve_sources
from tasks.spec import parse_spec
from tasks.stages.write import PredictionWriter
from tests.scripted_time import ScriptedTime


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_the_block_sets_and_restores_the_count(two_threads):
    with intra_op_threads(1) as n:
        assert n == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with intra_op_threads(None) as n:
        assert n == 2


@pytest.mark.slow  # a real request path over the shop workload
@pytest.mark.parametrize(("policy", "serving"), [(1, 1), (None, 2)])
def test_requests_are_served_with_the_policy_and_the_run_gets_its_threads_back(
    two_threads, shop_spec, many_shop_files, tmp_path, policy, serving
):
    shop_spec["model"] = {"d_model": 16, "layers": 1, "heads": 2}
    shop_spec["run"].update(
        mode="predict",
        scenario="server",
        request={"target_qps": 5.0, "min_requests": 4, "min_duration_s": 0.0, "intra_op_threads": policy},
    )
    spec = parse_spec(shop_spec)
    time = ScriptedTime()  # moves only while the server sleeps for an arrival
    work = Workload(Chain(spec, resolve_sources(spec, many_shop_files), torch.device("cpu"), clock=time.clock))
    work.list_keys()
    seen: list[int] = []
    frozen: list[int] = []
    serve_keys = work.chain.prepare

    def prepare_and_note(keys: np.ndarray, *args: object, **kwargs: object) -> object:
        seen.append(torch.get_num_threads())  # what the request's own steps ran with
        frozen.append(gc.get_freeze_count())
        return serve_keys(keys, *args, **kwargs)  # type: ignore[arg-type]

    work.chain.prepare = prepare_and_note  # type: ignore[method-assign]
    writer = PredictionWriter(tmp_path / "r.parquet")
    rec = run_requests(work, writer)
    writer.abort()
    assert len(seen) == 5 and set(seen) == {serving}  # the cold request and the four steady ones
    assert rec.metrics()[K.LATENCY_INTRA_OP_THREADS] == serving
    assert torch.get_num_threads() == 2
    # the heap is frozen by the timed region around the requests (tests/tasks/run/scenarios/test_region.py),
    # not by the requests themselves: one collect-and-freeze, before the region's clock starts
    assert set(frozen) == {0}
