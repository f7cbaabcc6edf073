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
from tasks.distributed.launch import RankReport, metrics, shapes_to_report, shard
from tasks.measure.clock import Clock, wall_clock
from tasks.sources.open import open_sources
from tasks.spec import parse_spec
from tasks.stages.chain import Chain
from tasks.stages.retrieve import list_root_keys
from tasks.stages.tensorize import Chunk, layout, target


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
        # The flow already checked the spec and made the data available: open the same sources
        # (the database when source.database is set) and run the same chain.
        device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
        enc = Encoding.from_dict(job["encoding"])
        clock = Clock(device)
        chain = Chain(
            rank_spec,
            open_sources(spec, Path(job["spec_dir"])),
            device,
            clock=clock,
            encoding=enc,
            schema=model_schema(layout(spec), target(spec), enc),
        )
        keys, _ = list_root_keys(spec, chain.sources)
        mine = shard(keys, rank, world)
        n = spec.run.chunk_rows
        chunks = [mine[i : i + n] for i in range(0, len(mine), n)]
        seconds = {s: 0.0 for s in (*chain.prepare_stages, "compute")}
        rows = {s: 0 for s in seconds}
        rows_read = 0
        stage_bytes: dict[str, int] = {}

        def add(stage: str, sec: float, n_rows: int) -> None:
            seconds[stage] += sec
            rows[stage] += n_rows

        chain.ensure_engine()  # the schema came with the job
        engine = chain.reference_engine()  # DDP is the reference model's (other libraries refuse it)
        # Heads for outputs a train step does not request get no gradient: let DDP find them.
        ddp = DistributedDataParallel(
            engine.model, device_ids=[local] if backend == "nccl" else None, find_unused_parameters=True
        )
        timer = _AllReduceTimer(dist.group.WORLD)
        ddp.register_comm_hook(timer, _timed_allreduce)
        # The train step runs the wrapped model (all-reduce in backward); without this the
        # ranks trained apart (the 2-process test saw 0 s of all-reduce).
        engine.train_through(ddp)
        cache: dict[int, Chunk] = {}
        updates_per_epoch = 0
        with ddp.join():
            for epoch in range(spec.run.epochs):
                before = engine.train_timings.updates
                for i, chunk in enumerate(chunks):
                    if i not in cache or len(chunks) > 1:  # one chunk stays in memory across epochs
                        prepared = chain.prepare(chunk, add)
                        rows_read += prepared.rows_read
                        for stage, nbytes in prepared.stage_bytes().items():
                            stage_bytes[stage] = stage_bytes.get(stage, 0) + nbytes
                        cache = {i: prepared.tz}
                    chain.train(cache[i], add)
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
            rows_read,
            shapes_to_report(engine.steady_shapes["train"]),
            stage_bytes,
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
                from tasks.tracking.writer import Tracker

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
