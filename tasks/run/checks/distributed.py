"""The distributed checks (``run.distributed``): what cannot run here, refused from the spec and the
device before any work, as every check in this folder (tasks/run/distributed trains)."""

from __future__ import annotations

import torch

from tasks.runtime.errors import UserError
from tasks.spec import Spec


def check(spec: Spec, device: torch.device) -> None:
    """Refuse a distributed setting that cannot run here, before any work."""
    d = spec.run.distributed
    if d is None:
        return
    if spec.run.mode != "train+predict":
        raise UserError(
            "run.distributed trains the model; it needs run.mode: train+predict "
            "(remove run.distributed for a predict run)."
        )
    if spec.run.batch_size % d.processes:
        raise UserError(
            f"run.batch_size ({spec.run.batch_size}) must be divisible by "
            f"run.distributed.processes ({d.processes}): the global batch is split evenly "
            "across ranks."
        )
    if d.backend == "nccl":
        if device.type != "cuda":
            raise UserError("run.distributed.backend nccl needs CUDA devices; use backend: gloo on CPU.")
        if torch.cuda.device_count() < d.processes:
            raise UserError(
                f"run.distributed.processes is {d.processes} but only "
                f"{torch.cuda.device_count()} CUDA devices are visible (nccl: one per rank)."
            )
    elif device.type == "cuda":
        raise UserError("run.distributed.backend gloo trains on CPU; set run.device: cpu, or use backend: nccl.")
    if spec.run.loader.num_workers > 0:
        raise UserError("run.distributed does not use loader workers yet; set run.loader.num_workers: 0.")
    if spec.run.checkpoint:
        raise UserError(
            "run.distributed does not resume from run.checkpoint yet (ranks start from fresh "
            "weights); remove run.checkpoint or run.distributed."
        )
