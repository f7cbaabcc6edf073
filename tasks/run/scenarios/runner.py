"""Run the spec's request scenario over a prepared workload (keys listed, model trained)."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import count

import numpy as np

from tasks.run.scenarios import server, single_stream
from tasks.run.scenarios.latency import LatencyRecord
from tasks.run.scenarios.request import RequestPath
from tasks.run.scenarios.schedule import poisson_arrivals, request_keys, validation_keys
from tasks.run.scenarios.workload import Workload
from tasks.runtime.errors import UserError
from tasks.runtime.threads import intra_op_threads
from tasks.stages.write import PredictionWriter


def run_requests(work: Workload, writer: PredictionWriter, max_requests: int | None = None) -> LatencyRecord:
    # The serving thread policy (run.request.intra_op_threads) covers the cold request and the
    # steady ones, and nothing before or after: training keeps its threads. (The heap is frozen
    # for the whole timed region, before it starts: tasks/measure/gcpauses.py.)
    with intra_op_threads(work.spec.run.request.intra_op_threads) as threads:
        rec = _run_scenario(work, writer, max_requests)
    rec.intra_op_threads = threads
    return rec


def _run_scenario(work: Workload, writer: PredictionWriter, max_requests: int | None) -> LatencyRecord:
    spec, clock = work.spec, work.chain.clock
    req, seed = spec.run.request, spec.run.seed
    keys = np.concatenate(work.chunks) if work.chunks else np.empty(0)
    pool = validation_keys(keys, spec, work.chain.sources)
    if len(pool) < req.roots:
        raise UserError(
            f"run.request.roots is {req.roots} but the workload has only {len(pool)} validation "
            "root keys to draw requests from; lower run.request.roots or raise "
            "task.validation_fraction."
        )
    serve = RequestPath(work, writer)
    pricing = work.pricing  # the progress count and the run's projection (tasks/run/scenarios/pricing.py)
    on_served = pricing.requests_served if pricing is not None else (lambda requests, roots, elapsed: None)
    if spec.run.scenario == "single_stream":
        if pricing is not None:
            pricing.begin_requests(None, req.min_requests)

        def stream() -> Iterator[np.ndarray]:
            for block in count():  # deterministic: a fresh seeded draw per 1024 requests
                yield from request_keys(pool, 1024, req.roots, seed + 7919 * block)

        rec = single_stream.run(
            serve,
            stream(),
            clock,
            min_requests=req.min_requests,
            min_duration_s=req.min_duration_s,
            roots=req.roots,
            max_requests=max_requests,
            settle=serve.settle,
            on_served=on_served,
        )
        rec.scored_keys, rec.served_outputs = serve.scored_keys, serve.outputs
        return rec
    arrivals = poisson_arrivals(req.target_qps, req.min_requests, req.min_duration_s, seed)
    keys_of = request_keys(pool, len(arrivals) + 1, req.roots, seed)
    if pricing is not None:
        pricing.begin_requests(float(arrivals[-1]), len(arrivals))
    rec = server.run(
        serve,
        arrivals,
        keys_of[1:],
        clock,
        max_batch=req.max_batch,
        max_wait_s=req.max_wait_ms / 1e3,
        cold_keys=keys_of[0],
        target_qps=req.target_qps,
        settle=serve.settle,
        on_served=on_served,
    )
    rec.scored_keys, rec.served_outputs = serve.scored_keys, serve.outputs
    return rec
