"""The ``peak-qps`` flow: the highest Poisson rate at which a server run is VALID, LoadGen's
server rule at the latency bound included.

    relflow-bench peak-qps SPEC --bound-ms 50

LoadGen's FindPeakPerformance for the server scenario. The search itself is
``tasks/run/scenarios/peak.py`` (double or halve, then bisect until the bracket is within 5%);
here each probe is a fresh-process ``relflow-bench run`` of the spec as a server run at the
probe's rate (``flows/sweeps/launch.py``, as a sweep's configurations are), a child MLflow
run of one parent run. A probe passes only when its run is VALID: LoadGen's server rule at
the bound (``latency.request_ms.p99_server_rule`` within it), and every other rule (issue
lateness, host load, output mismatches, quality), since a peak resting on a run the harness
itself calls untrustworthy would be published as if it were not. A ``train+predict`` spec is
trained once first, by one offline child run; every probe then loads its checkpoint
(``run.mode=predict``), so the probes time serving, not training, and serve the same weights.
The parent logs ``server.peak_qps`` only when the search bracketed the peak (a passing rate
below every failing one, and a rate whose probe missed the bound); the ends it did find always
(``server.peak_qps_bracket_low``; ``server.peak_qps_bracket_high``, the lowest rate whose p99
under the server rule was over the bound: a probe INVALID for another reason, host load or
output mismatches, caps the search but is no upper bound on the peak), the probes as
``peak_probes.json`` and the chart of p99 against rate as ``peak_qps.html``
(``dashboards/peak.py``).
"""

from __future__ import annotations

import copy
import json
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from dashboards.peak import peak_qps_figure
from flows.sweeps.launch import Launched, launch_local, prefect_api_url
from tasks.measure import keys as K
from tasks.run.scenarios.peak import PeakResult, Probe, check_args, search
from tasks.runtime import progress
from tasks.runtime.errors import UserError
from tasks.runtime.masking import mask_uri
from tasks.spec import Spec, apply_overrides, parse_spec
from tasks.tracking.writer import Tracker

P99_KEY = K.LATENCY_P99_SERVER_RULE


def probe_overrides(rate: float, bound_ms: float, checkpoint: str, requests: int, seconds: float) -> list[str]:
    """What turns the spec into one probe: a server run at ``rate`` from the checkpoint."""
    return [
        "run.scenario=server",
        "run.mode=predict",
        f"run.checkpoint={json.dumps(checkpoint)}",
        f"run.request.target_qps={rate!r}",
        f"run.request.latency_bound_ms={bound_ms!r}",
        f"run.request.min_requests={requests}",
        f"run.request.min_duration_s={seconds!r}",
    ]


def probe_from(rate: float, bound_ms: float, launched: Launched) -> Probe:
    """A probe passes when its run is VALID and LoadGen's server rule held at the bound (the
    lowest bound it passes, ``P99_KEY``, within ``bound_ms``; VALID implies it when the child
    judged the same bound, which the probe's overrides set)."""
    r = launched.summary
    if r is None:
        return Probe(rate, None, False, validity="FAILED", reasons=(launched.error or "the run failed",))
    p99 = r.metrics.get(P99_KEY)
    return Probe(
        rate,
        p99,
        r.validity == "VALID" and p99 is not None and p99 <= bound_ms,
        run_id=r.run_id,
        achieved_qps=r.metrics.get(K.LATENCY_ACHIEVED_QPS),
        validity=r.validity,
        reasons=tuple(r.invalid_reasons),
    )


@task(name="peak-probe", task_run_name="probe-{name}", cache_policy=NO_CACHE, persist_result=False, retries=0)
def run_child(
    name: str,
    spec: dict[str, Any],
    spec_dir: str,
    parent_run_id: str,
    tags: dict[str, str],
    workdir: str,
    tracking_uri: str,
    api_url: str | None,
) -> Launched:
    """One child (the training run or a probe) as a standalone ``relflow-bench run``."""
    return launch_local(
        spec,
        name=name,
        spec_dir=spec_dir,
        parent_run_id=parent_run_id,
        tags=tags,
        workdir=Path(workdir),
        tracking_uri=tracking_uri,
        api_url=api_url,
    )


@dataclass(frozen=True)
class Children:
    """Launches the search's child runs (the training run, the probes) under the parent run, each
    a fresh-process ``relflow-bench run`` whose log is kept on the parent."""

    tracker: Tracker
    parent_run_id: str
    attempt: str
    spec_dir: str
    workdir: str
    api_url: str | None
    tags: dict[str, str]

    def launch(self, name: str, spec: dict[str, Any], role_tags: dict[str, str]) -> Launched:
        child_tags = {"relflow.sweep.role": "child", "relflow.peak.attempt": self.attempt, **role_tags, **self.tags}
        launched = run_child(
            name, spec, self.spec_dir, self.parent_run_id, child_tags, self.workdir, self.tracker.uri, self.api_url
        )
        self.tracker.log_text(launched.log, f"children/{self.attempt}/{name}.log")
        return launched


def probe_checkpoint(base: Spec, children: Children) -> str:
    """The checkpoint every probe serves: the spec's ``run.checkpoint``, or, for a
    ``train+predict`` spec, the one an offline training child writes (trained once)."""
    checkpoint = base.run.checkpoint
    if base.run.mode == "train+predict":
        progress.emit("peak", kind="train")
        offline = apply_overrides(copy.deepcopy(base.to_dict()), ["run.scenario=offline"])
        trained = children.launch("train", offline, {"relflow.peak.role": "train"})
        if trained.summary is None or not trained.summary.checkpoint_path:
            raise RuntimeError(f"peak-qps: the training run failed: {trained.error}")
        checkpoint = str(Path(trained.summary.checkpoint_path).resolve())  # probes share the cwd; be sure
        progress.emit("peak", kind="trained", run_id=trained.summary.run_id, checkpoint=checkpoint)
    if checkpoint is None:
        raise UserError("peak-qps with run.mode=predict needs run.checkpoint; set it or use train+predict.")
    return checkpoint


@dataclass
class Prober:
    """``probe(rate)`` for the search: one server child run at ``rate`` from the checkpoint,
    judged by ``probe_from``; ``done`` keeps the probes in the order they ran."""

    base: Spec
    checkpoint: str
    bound_ms: float
    requests: int
    seconds: float
    children: Children
    done: list[Probe] = field(default_factory=list)

    def __call__(self, rate: float) -> Probe:
        index = len(self.done)
        progress.emit("peak", kind="start", rate=rate, index=index)
        overrides = probe_overrides(rate, self.bound_ms, self.checkpoint, self.requests, self.seconds)
        spec = parse_spec(
            apply_overrides(copy.deepcopy(self.base.to_dict()), overrides), f"(peak-qps probe at {rate:g} QPS)"
        ).to_dict()
        launched = self.children.launch(
            f"probe-{index}", spec, {"relflow.peak.role": "probe", "relflow.peak.qps": f"{rate:g}"}
        )
        p = probe_from(rate, self.bound_ms, launched)
        self.done.append(p)
        progress.emit("peak", kind="done", probe=p, index=index)
        return p


def start_parent(tracker: Tracker, base: Spec, attempt: str, tags: dict[str, str], params: dict[str, float]) -> str:
    """The search's parent MLflow run, with the search's settings as params; returns its id."""
    parent = tracker.start(
        f"{base.name}-peak-qps",
        {
            "relflow.sweep.role": "parent",
            "relflow.peak.attempt": attempt,
            "relflow.spec_hash": base.spec_hash,
            "relflow.spec_name": base.name,
            **tags,
        },
    )
    tracker.log_params(params)
    return parent


@flow(name="peak-qps", persist_result=False, validate_parameters=True)
def peak_qps(
    base_spec: dict[str, Any],
    bound_ms: float,
    spec_dir: str = ".",
    probe_requests: int = 662,
    probe_seconds: float = 10.0,
    start_qps: float | None = None,
    tolerance: float = 0.05,
    max_probes: int = 16,
    tags: dict[str, str] | None = None,
) -> dict[str, Any]:
    base = parse_spec(base_spec, "(peak-qps parameter 'base_spec')")
    check_args(bound_ms, probe_requests, probe_seconds, tolerance)
    start = start_qps or base.run.request.target_qps
    attempt = uuid.uuid4().hex[:12]
    tracker = Tracker(base.name)
    settings = {
        "peak.bound_ms": bound_ms,
        "peak.tolerance": tolerance,
        "peak.start_qps": start,
        "peak.probe_requests": probe_requests,
        "peak.probe_seconds": probe_seconds,
    }
    parent = start_parent(tracker, base, attempt, tags or {}, settings)
    workdir = tempfile.TemporaryDirectory(prefix="relflow-peak-")
    try:
        api_url = prefect_api_url()
        progress.emit("peak", kind="parent", run_id=parent)
        children = Children(tracker, parent, attempt, spec_dir, workdir.name, api_url, tags or {})
        checkpoint = probe_checkpoint(base, children)
        prober = Prober(base, checkpoint, bound_ms, probe_requests, probe_seconds, children)
        res = search(prober, bound_ms=bound_ms, start_qps=start, tolerance=tolerance, max_probes=max_probes)
        log_result(tracker, res)
        tracker.finish()
    except BaseException as err:
        tracker.fail(err)
        raise
    finally:
        workdir.cleanup()
    return {
        "parent_run_id": parent,
        "experiment": base.name,
        "tracking_uri": mask_uri(tracker.uri),  # printed and in --json
        "bound_ms": bound_ms,
        "peak_qps": res.low if res.bracketed else None,
        "bracket": [res.low, res.high],
        "unloaded_above_bound": res.unloaded_above_bound,
        "failed_otherwise": res.failed_otherwise,
        "probes": [probe_dict(p, bound_ms) for p in res.probes],
    }


def probe_dict(p: Probe, bound_ms: float) -> dict[str, Any]:
    return {
        "rate": p.rate,
        "p99_server_rule_ms": p.p99_ms,
        "passed": p.passed,
        "missed_bound": p.missed(bound_ms),  # failed by the bound, not for another reason
        "achieved_qps": p.achieved_qps,
        "validity": p.validity,
        "run_id": p.run_id,
        "reasons": list(p.reasons),
    }


def log_result(tracker: Tracker, res: PeakResult) -> None:
    metrics = {K.SERVER_PEAK_PROBES: float(len(res.probes))}
    # Each end the search found is a claim of its own (a lower or an upper bound on the peak);
    # the peak is claimed only between the two. The upper end is a probe that missed the bound,
    # never one INVALID for another reason (res.high).
    if res.low is not None:
        metrics[K.SERVER_PEAK_QPS_BRACKET_LOW] = res.low
    if res.high is not None:
        metrics[K.SERVER_PEAK_QPS_BRACKET_HIGH] = res.high
    if res.low is not None and res.high is not None:  # res.bracketed
        metrics[K.SERVER_PEAK_QPS] = res.low
    tracker.log_metrics(metrics)
    tracker.set_tags(
        {
            "relflow.peak.bracketed": str(res.bracketed),
            "relflow.peak.unloaded_above_bound": str(res.unloaded_above_bound),
            "relflow.peak.failed_otherwise": str(res.failed_otherwise),
        }
    )
    tracker.log_dict([probe_dict(p, res.bound_ms) for p in res.probes], "peak_probes.json")
    tracker.log_text(peak_qps_figure(res).to_html(include_plotlyjs=True, full_html=True), "peak_qps.html")
