"""Validity verdict, in the spirit of MLPerf LoadGen: a run that did not measure enough
steady state, recompiled after warm-up or missed its quality floor is INVALID. It still
finishes and records everything; the verdict says which rule failed and why."""

from __future__ import annotations

from tasks.spec import Spec


def verdict(spec: Spec, metrics: dict[str, float], headline: str) -> list[str]:
    """Reasons the run is invalid; empty when it is VALID."""
    r = spec.run
    reasons = []
    batches = int(metrics.get("compute.steady_batches", 0))
    if batches < r.min_steady_batches:
        reasons.append(f"steady batches {batches} < run.min_steady_batches {r.min_steady_batches}")
    seconds = metrics.get("compute.steady_seconds", 0.0)
    if seconds < r.min_steady_seconds:
        reasons.append(f"steady seconds {seconds:.3f} < run.min_steady_seconds {r.min_steady_seconds}")
    for key in ("compute.recompiles", "compute.train.recompiles"):
        n = int(metrics.get(key, 0))
        if n > r.max_recompiles:
            reasons.append(f"{key} {n} > run.max_recompiles {r.max_recompiles}")
    if r.max_host_load is not None:
        for key in ("host.load_per_core_start", "host.load_per_core_end"):
            load = metrics.get(key)
            if load is not None and load > r.max_host_load:
                reasons.append(f"{key} {load:.2f} > run.max_host_load {r.max_host_load}")
    floor = spec.task.min_quality
    if floor is not None:
        value = metrics.get(f"quality.{headline}")
        if value is None:
            reasons.append(f"quality.{headline} missing, task.min_quality {floor} cannot be checked")
        elif headline == "mae" and value > floor:
            reasons.append(f"quality.mae {value:.4f} > task.min_quality {floor}")
        elif headline != "mae" and value < floor:
            reasons.append(f"quality.{headline} {value:.4f} < task.min_quality {floor}")
    return reasons
