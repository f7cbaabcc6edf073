"""One DDP rank of a distributed training job: the ``torchrun`` entry (see ``tasks/run/distributed/launch.py``).

    python -m torch.distributed.run --standalone --nproc-per-node=N -m tasks.run.distributed.rank JOB.json

Each rank reads its shard of root keys (whole neighbourhoods) and trains on it through the
same ``Workload.train`` as a one-process run (tasks/run/scenarios/workload.py: the same chunks,
one-chunk cache and epoch loop; retrieve -> preprocess -> tensorize with the flow's encoding,
then the same ``Engine`` step, per-batch timing, warm-up apart), the model wrapped in
``DistributedDataParallel``. ``ddp.join()`` lets ranks with fewer batches finish without hanging
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
from tasks.libraries.reference.engine import Engine
from tasks.measure.clock import Clock, wall_clock
from tasks.measure.records import TrainingReport
from tasks.run.chain import Chain, Weights
from tasks.run.distributed.launch import RankReport, metrics, shapes_to_report, shard
from tasks.run.scenarios.workload import Workload
from tasks.sources.open import open_sources
from tasks.spec import parse_spec
from tasks.stages.retrieve import list_root_keys
from tasks.stages.tensorize import layout, target


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


def _rank_work(job: dict[str, Any], rank: int, world: int, local: int) -> tuple[Workload, Engine]:
    """This rank's workload: the flow's spec at ``batch_size / world``, the same sources and
    encoding, through the same chain, over this rank's shard of root keys."""
    spec = parse_spec(job["spec"], "(distributed job spec)")
    rank_spec = spec.model_copy(
        update={"run": spec.run.model_copy(update={"batch_size": spec.run.batch_size // world, "distributed": None})}
    )
    # The flow already checked the spec and made the data available: open the same sources
    # (the database when source.database is set) and run the same chain.
    device = torch.device("cuda", local) if job["backend"] == "nccl" else torch.device("cpu")
    enc = Encoding.from_dict(job["encoding"])
    chain = Chain(
        rank_spec,
        open_sources(spec, Path(job["spec_dir"])),
        device,
        clock=Clock(device),
        weights=Weights(encoding=enc, schema=model_schema(layout(spec), target(spec), enc)),
    )
    keys, _ = list_root_keys(spec, chain.sources)
    work = Workload(chain)
    work.use_keys(shard(keys, rank, world))
    chain.ensure_engine()  # the schema came with the job
    return work, chain.reference_engine()  # DDP is the reference model's (other libraries refuse it)


def _report(work: Workload, engine: Engine, rank: int, timer: _AllReduceTimer, training: TrainingReport) -> RankReport:
    """What this rank measured, from its workload's stage table (the train phase) and data."""
    stages = work.stages["train"]
    return RankReport(
        rank,
        asdict(engine.train_timings),
        {name: st.seconds for name, st in stages.items()},
        {name: st.rows for name, st in stages.items()},
        work.data.root_rows,
        training.updates_per_epoch,
        timer.seconds,
        timer.calls,
        sorted(engine.paths_seen),
        work.data.rows_read or 0,
        shapes_to_report(engine.steady_shapes["train"]),
        {name: st.bytes for name, st in stages.items() if st.bytes},
    )


def _hand_back(job: dict[str, Any], ddp: DistributedDataParallel, gathered: list[Any], threads: int) -> None:
    """Rank 0: the trained weights and every rank's report for the flow; a training job's
    figures logged to the flow's MLflow run (by run id)."""
    if job.get("weights"):
        torch.save({k: v.cpu() for k, v in ddp.module.state_dict().items()}, job["weights"])
    Path(job["out"]).write_text(json.dumps(gathered))
    if job["role"] != "train":
        return
    os.environ["MLFLOW_TRACKING_URI"] = job["tracking_uri"]
    from tasks.tracking.writer import Tracker

    tracker = Tracker(job["experiment"], job["tracking_uri"])
    tracker.run_id = job["run_id"]
    reports = [RankReport(**g) for g in gathered]
    tracker.log_metrics(metrics(reports, threads, job.get("reference_rows_per_s")))
    tracker.set_tags(
        {
            "relflow.distributed.backend": job["backend"],
            "relflow.distributed.processes": str(len(reports)),
            "relflow.distributed.rank_root_keys": ",".join(str(r.root_keys) for r in reports),
        }
    )


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
        work, engine = _rank_work(job, rank, world, local)
        # Heads for outputs a train step does not request get no gradient: let DDP find them.
        ddp = DistributedDataParallel(
            engine.model, device_ids=[local] if backend == "nccl" else None, find_unused_parameters=True
        )
        timer = _AllReduceTimer(dist.group.WORLD)
        ddp.register_comm_hook(timer, _timed_allreduce)
        # The train step runs the wrapped model (all-reduce in backward); without this the
        # ranks trained apart (the 2-process test saw 0 s of all-reduce).
        engine.train_through(ddp)
        with ddp.join():
            training = work.train()  # the workload's chunks, one-chunk cache and epoch loop, over this shard
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, asdict(_report(work, engine, rank, timer, training)))
        if rank == 0:
            _hand_back(job, ddp, gathered, threads)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
