"""One DDP rank of a distributed training job: the ``torchrun`` entry (see ``tasks/distributed/launch.py``).

    python -m torch.distributed.run --standalone --nproc-per-node=N -m tasks.distributed.rank JOB.json

Each rank reads its shard of root keys (whole neighbourhoods), runs retrieve -> preprocess ->
tensorize on it with the flow's encoding, and trains with the model wrapped in
``DistributedDataParallel`` through the same ``Engine`` loop as a one-process run (per-batch
timing, warm-up apart). ``ddp.join()`` lets ranks with fewer batches finish without hanging
the others. A communication hook times every all-reduce. Rank 0 gathers every rank's report,
writes it and the trained weights for the flow, and logs the distributed figures to the
flow's MLflow run (a reference job logs nothing).
"""

# No ``from __future__ import annotations``: DDP checks the comm hook's annotations at runtime.
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from model.arrow import Encoding, model_schema
from tasks.distributed.launch import RankReport, metrics, shard
from tasks.measure.clock import Clock, wall_clock
from tasks.measure.keys import PHASE_STAGES
from tasks.sources.files import resolve_sources
from tasks.sources.tpch import ensure_tpch
from tasks.spec import parse_spec
from tasks.stages.encode import encode as encode_text
from tasks.stages.encode import text_columns
from tasks.stages.preprocess import preprocess
from tasks.stages.retrieve import list_root_keys, retrieve
from tasks.stages.tensorize import layout, target, tensorize


class _DDP(DistributedDataParallel):
    """DDP that still offers the model's training helpers to ``Engine.train``."""

    def loss(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        loss: torch.Tensor = self.module.loss(*args, **kwargs)
        return loss

    def configure_optimizer(self) -> torch.optim.Optimizer:
        opt: torch.optim.Optimizer = self.module.configure_optimizer()
        return opt

    @property
    def last_encoder_path(self) -> str:
        return getattr(self.module, "last_encoder_path", "unknown")


class _AllReduceTimer:
    """State of the timing comm hook: seconds from each bucket's launch to its completion."""

    def __init__(self, group: Any) -> None:
        self.group, self.seconds, self.calls = group, 0.0, 0


def _timed_allreduce(
    state: _AllReduceTimer,
    bucket: dist.GradBucket,  # type: ignore[name-defined]  # (missing from torch's stubs)
) -> torch.futures.Future[torch.Tensor]:
    start = wall_clock()
    fut = default_hooks.allreduce_hook(state.group, bucket)

    def done(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        state.seconds += wall_clock() - start
        state.calls += 1
        return f.value()

    return fut.then(done)


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    from tasks.stages.compute import Engine

    threads = int(job["threads"])
    torch.set_num_threads(threads)
    backend = job["backend"]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if backend == "nccl":
        torch.cuda.set_device(local)
    dist.init_process_group(backend)
    try:
        spec = parse_spec(job["spec"], "(distributed job spec)")
        per_rank = spec.run.batch_size // world
        rank_spec = spec.model_copy(
            update={"run": spec.run.model_copy(update={"batch_size": per_rank, "distributed": None})}
        )
        # The flow already checked the spec and made the data available: resolve the same sources.
        base = Path(job["spec_dir"])
        if spec.source.generate is not None:
            base, _ = ensure_tpch(spec.source.generate.tpch.scale)
        sources = resolve_sources(spec, base)
        device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
        enc = Encoding.from_dict(job["encoding"])
        schema = model_schema(layout(spec), target(spec), enc)
        clock = Clock(device)
        keys, _ = list_root_keys(spec, sources)
        mine = shard(keys, rank, world)
        n = spec.run.chunk_rows
        chunks = [mine[i : i + n] for i in range(0, len(mine), n)]
        has_text = bool(text_columns(spec))  # the application's encode step, as in the flow
        seconds = {s: 0.0 for s in (*PHASE_STAGES["train"], *(["encode"] if has_text else []))}
        rows = {s: 0 for s in seconds}
        engine = Engine(rank_spec, schema, device, None, clock, enc)
        # Heads for outputs a train step does not request get no gradient: let DDP find them.
        ddp = _DDP(engine.model, device_ids=[local] if backend == "nccl" else None, find_unused_parameters=True)
        timer = _AllReduceTimer(dist.group.WORLD)
        ddp.register_comm_hook(timer, _timed_allreduce)
        engine.model = ddp  # type: ignore[assignment]  # the loop needs only forward/loss/optimizer
        # The train step calls engine.forward, bound to the bare model when the Engine was built:
        # without this the ranks trained apart (no all-reduce at all; the 2-process test saw 0 s).
        engine.forward = ddp
        cache: dict[int, Any] = {}
        updates_per_epoch = 0
        with ddp.join():
            for epoch in range(spec.run.epochs):
                before = engine.train_timings.updates
                for i, chunk in enumerate(chunks):
                    if i not in cache or len(chunks) > 1:  # one chunk stays in memory across epochs
                        with clock.measure() as span:
                            r = retrieve(spec, sources, chunk)
                        seconds["retrieve"] += span.seconds
                        rows["retrieve"] += r.root_rows
                        with clock.measure() as span:
                            pre = preprocess(spec, r)
                        seconds["preprocess"] += span.seconds
                        rows["preprocess"] += pre.root_rows
                        if has_text:
                            with clock.measure() as span:
                                pre = encode_text(spec, pre).pre
                            seconds["encode"] += span.seconds
                            rows["encode"] += pre.root_rows
                        with clock.measure() as span:
                            tz = tensorize(rank_spec, pre, enc, schema)
                        seconds["tensorize"] += span.seconds
                        rows["tensorize"] += tz.root_rows
                        cache = {i: tz}
                    tz = cache[i]
                    with clock.measure() as span:
                        engine.train(tz)
                    seconds["compute"] += span.seconds
                    rows["compute"] += int(tz.is_train.sum())
                if epoch == 0:
                    updates_per_epoch = engine.train_timings.updates - before
        report = RankReport(
            rank,
            asdict(engine.train_timings),
            seconds,
            rows,
            len(mine),
            updates_per_epoch,
            timer.seconds,
            timer.calls,
            sorted(engine.paths_seen),
        )
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, asdict(report))
        if rank == 0:
            if job.get("weights"):
                torch.save({k: v.cpu() for k, v in ddp.module.state_dict().items()}, job["weights"])
            Path(job["out"]).write_text(json.dumps(gathered))
            if job["role"] == "train":
                # Rank 0 logs the job's own figures to the flow's run (by run id).
                os.environ["MLFLOW_TRACKING_URI"] = job["tracking_uri"]
                from tasks.tracking.store import Tracker

                tracker = Tracker(job["experiment"], job["tracking_uri"])
                tracker.run_id = job["run_id"]
                reports = [RankReport(**g) for g in gathered]
                tracker.log_metrics(metrics(reports, threads, job.get("reference_rows_per_s")))
                tracker.set_tags(
                    {
                        "relflow.distributed.backend": backend,
                        "relflow.distributed.processes": str(world),
                        "relflow.distributed.rank_root_keys": ",".join(str(r.root_keys) for r in reports),
                    }
                )
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
