"""Specs derived from a run's spec for a second pass over the same data after the timed
region: the reference pass (tasks/run/reference_pass.py) and the output check's plain pass
(tasks/run/scenarios/outputs.py). One place, so both leave out the same run-only settings."""

from __future__ import annotations

from typing import Any

from tasks.spec.parse import parse_spec
from tasks.spec.workload import Spec


def eager_spec(spec: Spec, **run_updates: Any) -> Spec:
    """``spec`` served by plain PyTorch eager in this process: no other backend, compiler,
    loader workers, checkpoint, reference, quality gate, profiler or DDP; ``run_updates`` on top."""
    raw = spec.to_dict()
    run = dict(raw["run"])
    run.update(
        backend="pytorch",
        compile={},
        loader={},
        checkpoint=None,
        reference_checkpoint=None,
        max_quality_drop=None,
        check_outputs=False,
        profile=False,
        distributed=None,
    )
    run.update(run_updates)
    return parse_spec({**raw, "run": run})
