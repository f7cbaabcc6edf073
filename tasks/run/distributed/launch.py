"""Distributed training: ``run.distributed`` trains with PyTorch DDP over several processes.

The flow stays one process; for the train phase it launches ``torchrun`` (``python -m
torch.distributed.run --standalone``) with ``tasks.run.distributed.rank`` as the entry. The flow
first fits the encoding on the first chunk (as a single-process run does), so every rank
encodes the same way; each rank then takes its **shard of root keys** (a hash of the key, so
a rank retrieves whole neighbourhoods: a root row with every branch row under it), runs
retrieve -> preprocess -> tensorize on it and trains ``run.epochs`` epochs with DDP. The global
batch stays ``run.batch_size`` (each rank takes ``batch_size / processes``), so the number of
optimizer updates per epoch, and with it the quality, matches a one-process run.

Rank 0 logs the distributed figures to the flow's MLflow run and hands the trained weights
back; the flow predicts and writes as usual. Threads per rank are set explicitly
(``run.distributed.threads_per_process``; torchrun would otherwise set ``OMP_NUM_THREADS=1``)
and recorded. ``compute.train.scaling_efficiency`` = throughput(N) / (N x throughput(1)),
where throughput(1) is a one-process torchrun of the same spec and threads, timed in the same
flow just before (``run.distributed.reference``), so the two are measured side by side.

Metric keys (``tasks/measure/keys.py``, units in its CATALOGUE): ``compute.train.rank<r>.rows_per_s``
(steady trained rows/s of each rank), ``compute.train.total_rows_per_s`` (their sum),
``compute.train.allreduce_seconds`` (rank 0, DDP communication hook: from each bucket's
all-reduce launch to its completion, overlapping backward), ``compute.train.allreduce_fraction``
(of rank 0's step time), ``compute.train.reference_rows_per_s``,
``compute.train.scaling_efficiency``, ``compute.train.processes``,
``compute.train.threads_per_process``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from tasks.libraries.reference.engine import Engine
from tasks.measure import keys as K
from tasks.measure.records import DataTally, PhaseTimings, StageTable, TrainingReport
from tasks.run.scenarios.workload import Workload

HASH_SEED = 20_240_611  # fixed: the same key lands on the same rank in every run


def shard(keys: np.ndarray, rank: int, world: int) -> np.ndarray:
    """This rank's root keys: a stable hash of the key modulo the world size (vectorised)."""
    if world == 1:
        return keys
    h = pl.Series(keys).hash(seed=HASH_SEED).to_numpy()
    mine: np.ndarray = keys[(h % np.uint64(world)) == rank]
    return mine


@dataclass
class RankReport:
    """What one rank measured; rank 0 gathers every rank's and writes them out."""

    rank: int
    train: dict[str, Any]  # PhaseTimings fields
    stage_seconds: dict[str, float]
    stage_rows: dict[str, int]
    root_keys: int
    updates_per_epoch: int
    allreduce_seconds: float = 0.0
    allreduce_calls: int = 0
    encoder_paths: list[str] = field(default_factory=list)
    rows_read: int = 0  # source rows this rank read (root and branches), every epoch
    # Root rows of its steady train batches by present shape, as [*shape, rows] lists (JSON):
    # compute.train.mfu counts their FLOPs (tasks/measure/present_flops.py).
    steady_shapes: list[list[int]] = field(default_factory=list)
    stage_bytes: dict[str, int] = field(default_factory=dict)  # Prepared.stage_bytes, every epoch

    @property
    def timings(self) -> PhaseTimings:
        return PhaseTimings(**self.train)

    @property
    def steady_rows_per_s(self) -> float:
        t = self.timings
        secs = sum(t.steady_seconds)
        return sum(t.steady_rows) / secs if secs > 0 else 0.0


def shapes_to_report(shapes: Counter[tuple[int, ...]]) -> list[list[int]]:
    return [[*shape, n] for shape, n in sorted(shapes.items())]


def shapes_from_report(rows: list[list[int]]) -> Counter[tuple[int, ...]]:
    return Counter({tuple(r[:-1]): r[-1] for r in rows})


@dataclass(frozen=True)
class TrainStages:
    """The train phase's stage table of a DDP job, each second counted once.

    ``seconds`` are the **slowest rank's** (the one with the largest retrieve..compute total):
    the ranks run in parallel, so the phase took at least that rank's time, and its stages
    add up to ``e2e.train.seconds``. (Per-stage maxima over ranks, summed, describe no rank.)
    ``rows`` and ``bytes`` are every rank's, so rows and bytes per second are the job's. ``mean_seconds`` is the
    ranks' mean total (``e2e.train.ranks_mean_seconds``), beside it for the imbalance."""

    seconds: dict[str, float]
    rows: dict[str, int]
    slowest_rank: int
    mean_seconds: float
    bytes: dict[str, int] = field(default_factory=dict)


def train_stages(reports: list[RankReport]) -> TrainStages:
    totals = [sum(r.stage_seconds.values()) for r in reports]
    slowest = reports[max(range(len(reports)), key=lambda i: totals[i])]
    stages = {k for r in reports for k in (*r.stage_seconds, *r.stage_rows)}
    return TrainStages(
        {k: slowest.stage_seconds.get(k, 0.0) for k in stages},
        {k: sum(r.stage_rows.get(k, 0) for r in reports) for k in stages},
        slowest.rank,
        sum(totals) / len(totals),
        {k: sum(r.stage_bytes.get(k, 0) for r in reports) for k in {k for r in reports for k in r.stage_bytes}},
    )


def merge_into(stages: StageTable, data: DataTally, reports: list[RankReport]) -> TrainStages:
    """The ranks' train stages into the flow's stage table, their rows read into its tally."""
    agg = train_stages(reports)
    for stage, timing in stages["train"].items():  # (encode too, with text columns)
        timing.add(agg.seconds.get(stage, 0.0), agg.rows.get(stage, 0))
        timing.bytes += agg.bytes.get(stage, 0)
    data.rows_read = (data.rows_read or 0) + sum(r.rows_read for r in reports)
    return agg


def adopt_rank0(engine: Engine, reports: list[RankReport]) -> None:
    """compute.train.* of a distributed run are rank 0's: its step timings, encoder paths and
    the steady batches' shapes (without them the flow's own engine, which trained nothing,
    gave compute.train.mfu 0)."""
    r0 = reports[0]
    engine.train_timings = r0.timings
    engine.paths_seen.update(r0.encoder_paths)
    engine.steady_shapes["train"] = shapes_from_report(r0.steady_shapes)


def metrics(reports: list[RankReport], threads: int, reference_rows_per_s: float | None) -> dict[str, float]:
    """The distributed figures of one training job (the keys in the module docstring)."""
    n = len(reports)
    out = {K.ddp_rank_rows_per_s(r.rank): r.steady_rows_per_s for r in reports}
    out.update({K.ddp_rank_rows_read(r.rank): float(r.rows_read) for r in reports})
    total = sum(r.steady_rows_per_s for r in reports)
    r0 = reports[0]
    step_seconds = (
        sum(r0.timings.steady_seconds) + sum(r0.timings.warmup_seconds) + (r0.timings.first_call_seconds or 0.0)
    )
    out.update(
        {
            K.DDP_TOTAL_ROWS_PER_S: total,
            K.DDP_ALLREDUCE_SECONDS: r0.allreduce_seconds,
            K.DDP_ALLREDUCE_FRACTION: r0.allreduce_seconds / step_seconds if step_seconds > 0 else 0.0,
            K.DDP_PROCESSES: float(n),
            K.DDP_THREADS_PER_PROCESS: float(threads),
        }
    )
    if reference_rows_per_s:
        out[K.DDP_REFERENCE_ROWS_PER_S] = reference_rows_per_s
        out[K.DDP_SCALING_EFFICIENCY] = total / (n * reference_rows_per_s)
    return out


def launch(job: dict[str, Any], processes: int, threads: int, workdir: Path) -> list[RankReport]:
    """Run one torchrun job to completion; returns every rank's report (rank order)."""
    job_file = workdir / f"job-{processes}.json"
    out = workdir / f"reports-{processes}.json"
    job_file.write_text(json.dumps({**job, "out": str(out)}))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={processes}",
        "-m",
        "tasks.run.distributed.rank",
        str(job_file),
    ]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    log = workdir / f"torchrun-{processes}.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait()
        except BaseException:
            # Interrupted: stop the ranks (their process group) so nothing trains on unseen.
            import signal

            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
            raise
    if code != 0 or not out.exists():
        raise RuntimeError(
            f"torchrun with {processes} processes failed (exit {code}):\n{failure_text(log.read_text())}"
        )
    return [RankReport(**r) for r in json.loads(out.read_text())]


ABORT_LINES = ("terminate called", "what():", "Abort", "Fatal Python error", "gloo", "Segmentation fault")


def failure_text(log: str, limit: int = 6000) -> str:
    """What a failed torchrun job says about its cause: the failing rank's own traceback (before
    torchrun's summary), and first any line a rank that died on a signal printed before it (a
    C++ abort such as gloo's ``terminate called ... what(): ...`` has no Python traceback, and
    torchrun's summary then says only ``Signal 6 (SIGABRT)``)."""
    first = log.find("Traceback")
    before = log[: max(first, 0)].splitlines()
    notes = [line for line in before if any(mark in line for mark in ABORT_LINES)]
    return "\n".join([*notes[-20:], log[max(first, 0) :][:limit]])


def train(work: Workload, spec_dir: Path, run_id: str, experiment: str, tracking_uri: str) -> TrainingReport:
    """The train phase of ``work`` with DDP: fills its engine, adds the ranks' stages and reads
    to the workload's; returns the job's epochs, updates per epoch (rank 0's: every rank takes
    the same updates) and the ranks' mean train stage seconds. Rank 0 logs the DDP figures
    (``metrics``) itself."""
    spec = work.spec
    d = spec.run.distributed
    assert d is not None  # the flow calls this only with run.distributed set
    # The encoding is fitted on the first chunk (as a 1-process run does) outside the stage
    # table: the ranks prepare every chunk again, and their seconds are the train stages'.
    # This fit lands in harness.distributed_launch_seconds (tasks/run/scenarios/region.py).
    work.chain.prepare_untimed(work.chunks[0])
    engine, enc = work.chain.reference_engine(), work.chain.encoding  # DDP: the reference model's
    assert enc is not None  # set by the first chunk
    with tempfile.TemporaryDirectory(prefix="relflow-ddp-") as tmp:
        work_dir = Path(tmp)
        job = {
            "spec": spec.to_dict(),
            "spec_dir": str(spec_dir),
            "encoding": enc.to_dict(),
            "backend": d.backend,
            "threads": d.threads_per_process,
            "run_id": run_id,
            "experiment": experiment,
            "tracking_uri": tracking_uri,
            "weights": str(work_dir / "weights.pt"),
        }
        reference = None
        if d.reference and d.processes > 1:
            ref = launch({**job, "role": "reference", "weights": None}, 1, d.threads_per_process, work_dir)
            reference = ref[0].steady_rows_per_s
        reports = launch(
            {**job, "role": "train", "reference_rows_per_s": reference}, d.processes, d.threads_per_process, work_dir
        )
        state = torch.load(work_dir / "weights.pt", map_location=engine.device, weights_only=True)
    engine.model.load_state_dict(state)
    adopt_rank0(engine, reports)
    agg = merge_into(work.stages, work.data, reports)
    return TrainingReport(spec.run.epochs, reports[0].updates_per_epoch, agg.mean_seconds)
