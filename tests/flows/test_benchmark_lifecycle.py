"""Run lifecycle through the real CLI: SIGTERM or SIGINT, to the process or its group, end
in exit 130 within 10 s with the MLflow run KILLED and no outputs left; a SIGKILLed run is
ended KILLED by the next invocation; two concurrent runs never overlap their timed regions.

Named ``test_benchmark_lifecycle.py`` (tests/README.md): test_benchmark.py holds the flow's main
end-to-end test; this file is one aspect of a benchmark-flow run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.repo import ANY_STEADY, SMALL_MODEL, as_cli

OVERRIDES = as_cli([*SMALL_MODEL, "run.batch_size=512", *ANY_STEADY])


def _cli(args: list[str], cwd: Path, uri: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    env = dict(env or os.environ, MLFLOW_TRACKING_URI=uri)
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _runs(uri: str):
    client = MlflowClient(tracking_uri=uri)
    exps = client.search_experiments()
    return client.search_runs([e.experiment_id for e in exps]) if exps else []


CONTRACT_S = 10.0  # the README's promise for interrupts, not a speed claim
LONG = [*OVERRIDES, "--set", "run.epochs=300", "--set", "run.system_metrics_interval_s=0"]
CASES = [(sig, group) for sig in (signal.SIGTERM, signal.SIGINT) for group in (False, True)]


def _start_long_run(folder: Path) -> tuple[subprocess.Popen, str]:
    """A long CLI run in its own process group (as a terminal gives), once its MLflow run is
    RUNNING and a stage is under way."""
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri).search_experiments()  # migrate before the CLI polls it
    env = dict(os.environ, PREFECT_HOME=str(folder / "prefect-home"))
    env.pop("PREFECT_API_URL", None)
    proc = _cli(LONG, folder, uri, env=env, start_new_session=True)
    deadline = time.monotonic() + 280
    while time.monotonic() < deadline and proc.poll() is None:
        if any(r.info.status == "RUNNING" for r in _runs(uri)):
            break
        time.sleep(0.5)
    assert proc.poll() is None, f"run ended before it could be interrupted: {proc.communicate()}"
    time.sleep(2)  # inside the stages now
    return proc, uri


def _group_gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _interrupt(folder: Path, sig: signal.Signals, group: bool) -> dict:
    proc, uri = _start_long_run(folder)
    start = time.monotonic()
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    seconds = time.monotonic() - start
    outputs = folder / "outputs"
    return {
        "rc": proc.returncode,
        "seconds": seconds,
        "stderr": err,
        "runs": _runs(uri),
        "leftover_group": not _group_gone(proc.pid),
        "outputs": sorted(p.name for p in outputs.rglob("*")) if outputs.exists() else [],
    }


@pytest.fixture(scope="module")
def interrupted(tpch_small, tmp_path_factory) -> dict:
    """The four cases, two at a time (each starts Prefect)."""
    root = tmp_path_factory.mktemp("signals")
    folders = {}
    for sig, group in CASES:
        folders[(sig, group)] = root / f"{sig.name}-{'group' if group else 'process'}"
        folders[(sig, group)].mkdir()
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {k: pool.submit(_interrupt, folders[k], *k) for k in CASES}
        return {k: f.result() for k, f in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("sig, group", CASES, ids=[f"{s.name}-{'group' if g else 'process'}" for s, g in CASES])
def test_signal_ends_in_130_with_the_run_killed_and_nothing_left(interrupted, sig, group):
    """SIGTERM/SIGINT to the process or its whole group (which also kills Prefect's temporary
    server; the client used to retry ~70 s, then exit 1 with the run FAILED)."""
    r = interrupted[(sig, group)]
    assert r["rc"] == 130, r["stderr"][-2000:]
    assert r["seconds"] <= CONTRACT_S, r["seconds"]
    assert [run.info.status for run in r["runs"]] == ["KILLED"]
    assert sig.name in r["runs"][0].data.tags["relflow.error"]
    assert f"interrupted by {sig.name}" in r["stderr"]
    assert "Traceback" not in r["stderr"]
    assert not [n for n in r["outputs"] if n.endswith((".parquet", ".ckpt")) or ".tmp-" in n], r["outputs"]
    assert not r["leftover_group"], "a process of the run's group outlived it"


@pytest.mark.slow
def test_sigkilled_run_is_ended_killed_by_the_next_invocation(tpch_small, tmp_path):
    """SIGKILL (or the OOM killer) leaves the run RUNNING; the next CLI invocation on this
    host finds its process gone and ends it KILLED, even one that then fails on bad input."""
    proc, uri = _start_long_run(tmp_path)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert [r.info.status for r in _runs(uri)] == ["RUNNING"]
    nxt = _cli([*OVERRIDES, "--set", "run.device=banana"], tmp_path, uri)
    _, err = nxt.communicate(timeout=300)
    assert nxt.returncode == 2, err[-2000:]
    (run,) = _runs(uri)
    assert run.info.status == "KILLED"
    assert run.data.tags["relflow.found_stale"] == "true"
    assert str(proc.pid) in run.data.tags["relflow.error"]


def _lock_waiters(lock: Path) -> int:
    """Processes blocked on ``lock`` right now: /proc/locks lists a waiter with '->' (once
    per lock it waits behind, so counted by pid): ``N: -> FLOCK ADVISORY WRITE pid dev:inode ...``."""
    inode = f":{lock.stat().st_ino}"
    pids = set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and len(fields) > 6 and fields[6].endswith(inode):
            pids.add(fields[5])
    return len(pids)


@pytest.mark.slow
def test_concurrent_runs_never_overlap_timed_regions(tpch_small, tmp_path, monkeypatch):
    """The test holds the host lock until both runs are blocked on it, then 2 s more: each run
    must report at least the wait the test imposed, the second also the first run's region."""
    from tasks.runtime.hostlock import host_lock

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    lock = tmp_path / "host.lock"
    monkeypatch.setenv("RELFLOW_LOCK_FILE", str(lock))  # this test's lock: other tests' runs do not touch it
    # Create the store first so the two processes do not race on its migrations.
    MlflowClient(tracking_uri=uri).search_experiments()
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        d.mkdir()
    hold_s = 2.0
    with host_lock():
        # predict mode (untrained weights): the lock and the regions are the subject, not training
        procs = [_cli([*OVERRIDES, "--set", "run.mode=predict"], d, uri) for d in dirs]
        deadline = time.monotonic() + 400
        while _lock_waiters(lock) < 2:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "runs never waited"
            time.sleep(0.2)
        both_waiting = time.time()
        time.sleep(hold_s)
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    runs = _runs(uri)
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)
    spans = sorted(
        (
            r.data.metrics["harness.timed_region_start_unix_s"],
            r.data.metrics["harness.timed_region_end_unix_s"],
            r.data.metrics["harness.lock_wait_seconds"],
        )
        for r in runs
    )
    (start_a, end_a, wait_a), (start_b, _, wait_b) = spans
    assert end_a <= start_b, f"timed regions overlap: {spans}"
    # harness.lock_wait_seconds is the time spent asking for the host lock. Both runs were
    # blocked on it at both_waiting and got it only after the test let go, hold_s later; the
    # second got it only after the first run's region ended and its lock was released. Nothing
    # orders wait_a and wait_b: the second may have started asking well after the first.
    assert start_a >= both_waiting + hold_s, spans
    assert wait_a >= hold_s, spans
    assert wait_b >= end_a - both_waiting, spans
    assert wait_b >= hold_s + (end_a - start_a), spans
