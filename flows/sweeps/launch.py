"""How a sweep runs one configuration: ``launch_local`` starts it in a fresh process.

A configuration sharing the sweep's process inherits everything the ones before it left
behind: Inductor/Dynamo caches (a warm first call, and Dynamo's recompile budget spent by
earlier shapes: the padded + compiled configurations of an 8-point grid hit
``FailOnRecompileLimitHit``), allocator state and the peak RSS of earlier runs. So each
configuration is exactly a standalone ``relflow-bench run`` of its spec, in its own Python
process, with ``--parent-run`` and the sweep's tags: its figures are those of a standalone
run, and its MLflow run is a child of the sweep's parent run.

The on-disk compiler caches are not in the process, so each child also gets compiler cache
folders of its own, empty, removed when it ends (``COMPILER_CACHES``): with the user's shared
default (``/tmp/torchinductor_<user>``), a compiled configuration's first call took graphs an
earlier configuration (or an earlier run) had compiled, 2.9 s against 14.1 s standalone, and a
sweep's figures depended on the order of its grid. Each child's ``compute.compile_cache_hits``
says what its compiles took from a cache (0 here).

The child gets the sweep's MLflow store and Prefect API (no second temporary server to
boot) and runs the same code as the sweep (``PYTHONPATH``). Interrupts are passed on: the
child's CLI ends its MLflow run KILLED, as a standalone run does. A fan-out launcher (work
pools via ``run_deployment``) can sit beside ``launch_local`` with the same ``Launched``
result.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tasks.measure.report import RunSummary

REPO = Path(__file__).resolve().parents[2]
# How long an interrupted child may take to end its MLflow run before the next signal.
GRACE_S = 30.0


@dataclass
class Launched:
    """What one configuration's process returned."""

    returncode: int
    summary: RunSummary | None  # the run's report (``relflow-bench run --json``), if it finished
    error: str | None  # the child's one-paragraph error, if it failed
    log: str  # the child's console output


def prefect_api_url() -> str | None:
    """The API of the Prefect server this process talks to (the temporary one included)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        url = str(client.api_url)
    return url if url.startswith("http") else None


# Every cache a compile can be warmed from: Inductor's FX-graph and AOTAutograd caches live under
# TORCHINDUCTOR_CACHE_DIR; Triton's compiled kernels (CUDA) default to ~/.triton/cache.
COMPILER_CACHES = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}


def compiler_cache_env(cache_dir: Path) -> dict[str, str]:
    """The environment that isolates every compiler cache under ``cache_dir``."""
    return {var: str(cache_dir / sub) for var, sub in COMPILER_CACHES.items()}


def child_env(tracking_uri: str, api_url: str | None, compiler_cache: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if compiler_cache is not None:
        env.update(compiler_cache_env(compiler_cache))
    env["MLFLOW_TRACKING_URI"] = tracking_uri
    env["COLUMNS"] = "200"  # the child's closing message on few lines, for the summary
    if api_url:
        env["PREFECT_API_URL"] = api_url
    # The child runs this checkout's code, whatever is installed.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def run_command(spec_file: Path, spec_dir: str, parent_run_id: str, tags: dict[str, str], json_out: Path) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "flows.cli",
        "run",
        str(spec_file),
        "--spec-dir",
        spec_dir,
        "--parent-run",
        parent_run_id,
        "--json",
        str(json_out),
    ]
    for k, v in tags.items():
        cmd += ["--tag", f"{k}={v}"]
    return cmd


def launch_local(
    spec: dict[str, Any],
    *,
    name: str,
    spec_dir: str,
    parent_run_id: str,
    tags: dict[str, str],
    workdir: Path,
    tracking_uri: str,
    api_url: str | None,
) -> Launched:
    """Run ``spec`` as ``python -m flows.cli run`` in a fresh process and wait for it."""
    spec_file = workdir / f"{name}.yaml"
    spec_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    json_out, log_file = workdir / f"{name}.json", workdir / f"{name}.log"
    cmd = run_command(spec_file, spec_dir, parent_run_id, tags, json_out)
    cache = workdir / f"{name}.compiler-cache"  # empty: the child compiles cold, as standalone
    env = child_env(tracking_uri, api_url, cache)
    try:
        with open(log_file, "w") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            try:
                rc = proc.wait()
            except BaseException as err:
                _stop(proc, interrupted=isinstance(err, KeyboardInterrupt))
                raise
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    text = log_file.read_text(errors="replace")
    if rc == 0 and json_out.is_file():
        return Launched(rc, RunSummary.from_json(json_out.read_text()), None, text)
    return Launched(rc, None, child_error(text, rc), text)


def _stop(proc: subprocess.Popen, interrupted: bool) -> None:
    """End the child so its MLflow run is closed: Ctrl-C reached it too (same process
    group), so first let it unwind; then SIGTERM (its CLI unwinds the same way); then kill."""
    steps: list[signal.Signals | None] = [None] if interrupted else []
    steps += [signal.SIGTERM, signal.SIGKILL]
    for sig in steps:
        if proc.poll() is not None:
            return
        if sig is not None:
            proc.send_signal(sig)
        try:
            proc.wait(timeout=GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue
        except KeyboardInterrupt:  # a second Ctrl-C: go straight to the next signal
            continue


def child_error(text: str, rc: int) -> str:
    """The child CLI's closing paragraph as ``Type: message`` on one line."""
    marks = {m: text.rfind(m) for m in ("error:", "failed:", "interrupted:")}
    mark, cut = max(marks.items(), key=lambda kv: kv[1])
    if cut < 0:
        return f"exit code {rc}: " + " ".join(text[-2000:].split())
    body = " ".join(text[cut + len(mark) :].replace("(rerun with --debug for the traceback)", "").split())
    prefix = {"error:": "UserError: ", "failed:": "", "interrupted:": "interrupted: "}[mark]
    return prefix + body
