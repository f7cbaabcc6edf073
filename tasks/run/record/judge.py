"""The flow's ``judge`` step: every rule a finished run is held to, as one list of reasons.

Empty means VALID. The rules by what they judge:

- the offline validity rules (validity.py: steady windows, recompiles, host load, quality);
  a request run is not held to the predict phase's offline steady window;
- a request run's LoadGen rules (tasks/run/scenarios/latency.py: request count, early stopping,
  duration, the server's bound, issue lateness) and its output check;
- quality against the majority-class / mean baseline, where the weights were trained;
- an offline run's output check (run.check_outputs);
- MFU above 1 (utilisation.py) and quality lost to dropped rows (reference.py).
"""

from __future__ import annotations

from tasks.measure.utilisation import utilisation_reasons
from tasks.run.record.baseline import no_better_than_baseline
from tasks.run.record.validity import verdict
from tasks.run.reference_pass import drop_reasons
from tasks.run.scenarios.invocation import Invocation, Timed
from tasks.run.scenarios.latency import verdict as latency_verdict


def judge(run: Invocation, timed: Timed, metrics: dict[str, float]) -> list[str]:
    """The validity verdict (empty: VALID)."""
    reasons = verdict(run.spec, metrics, run.engine.quality.headline)
    latency = timed.latency
    if latency is not None:
        reasons += latency_verdict(run.spec.run.scenario, run.spec.run.request, metrics)
        if latency.output_check is not None:
            reasons += latency.output_check.reasons()
    if not run.quality_meaningful and run.spec.task.min_quality is not None:
        reasons.append("task.min_quality set but weights are untrained (predict without run.checkpoint)")
    if run.quality_meaningful:  # a model no better than the majority class / the mean
        reasons += no_better_than_baseline(metrics)
    if timed.output_check is not None:
        reasons += timed.output_check.reasons()
    return reasons + utilisation_reasons(metrics) + drop_reasons(run.spec, metrics)
