"""Validity verdict, in the spirit of MLPerf LoadGen: a run that did not measure enough
steady state (in any phase it ran), recompiled after warm-up, ran on a busy host or missed
its quality floor is INVALID. It still finishes and records everything; the verdict says
which rule failed and why.

A request run (single_stream, server) measures requests, not a throughput pass: LoadGen's
rules judge that part (request count, early stopping, duration, the server's bound and issue
lateness: ``tasks/run/scenarios/latency.py``), so the offline steady window of the predict phase
(``run.min_steady_batches``, ``run.min_steady_seconds`` over the compute stage's steady
batches) does not apply to it: its "batches" are the served calls, and their compute seconds
are a slice of each request's latency (64 requests over 2 s had 0.4 s of compute). Training
(train+predict) is still an offline phase and keeps its window; recompiles after warm-up (they
land in a request's latency), the host's load and the quality floor apply as offline."""

from __future__ import annotations

import math

from tasks.measure import keys as K
from tasks.spec import Spec


def _steady_rules(spec: Spec, metrics: dict[str, float], phase: str) -> list[str]:
    """Each phase that ran needs its own steady window: predict's cannot vouch for train's."""
    r = spec.run
    batches_key, seconds_key = K.compute(phase, "steady_batches"), K.compute(phase, "steady_seconds")
    reasons = []
    batches = int(metrics.get(batches_key, 0))
    if batches < r.min_steady_batches:
        reasons.append(f"{batches_key} {batches} < run.min_steady_batches {r.min_steady_batches}")
    seconds = metrics.get(seconds_key, 0.0)
    if seconds < r.min_steady_seconds:
        reasons.append(f"{seconds_key} {seconds:.3f} < run.min_steady_seconds {r.min_steady_seconds}")
    return reasons


def _quality_rule(spec: Spec, metrics: dict[str, float], headline: str) -> list[str]:
    floor = spec.task.min_quality
    if floor is None:
        return []
    key = K.quality(headline)
    value = metrics.get(key)
    if value is None:
        return [f"{key} missing, task.min_quality {floor} cannot be checked"]
    if math.isnan(value):
        return [
            f"{key} is NaN (nothing to score, e.g. one class only in the held-out rows), "
            f"so task.min_quality {floor} is not met"
        ]
    if headline == "mae" and value > floor:  # an error ceiling, in the target's units
        return [f"{key} {value:.4f} > task.min_quality {floor}"]
    if headline != "mae" and value < floor:
        return [f"{key} {value:.4f} < task.min_quality {floor}"]
    return []


def verdict(spec: Spec, metrics: dict[str, float], headline: str) -> list[str]:
    """Reasons the run is invalid; empty when it is VALID."""
    r = spec.run
    reasons = []
    phases = ["train", "predict"] if r.mode == "train+predict" else ["predict"]
    for phase in phases:
        if phase == "train" or r.scenario == "offline":
            reasons += _steady_rules(spec, metrics, phase)
        key = K.compute(phase, "recompiles")
        n = int(metrics.get(key, 0))
        if n > r.max_recompiles:
            reasons.append(f"{key} {n} > run.max_recompiles {r.max_recompiles}")
    if r.max_host_load is not None:
        for key in (K.HOST_OTHER_CPU_FRACTION_BEFORE, K.HOST_OTHER_CPU_FRACTION):
            share = metrics.get(key)
            if share is not None and share > r.max_host_load:
                reasons.append(
                    f"{key} {share:.2f} > run.max_host_load {r.max_host_load} (other processes used the cores)"
                )
    reasons += _quality_rule(spec, metrics, headline)
    return reasons
