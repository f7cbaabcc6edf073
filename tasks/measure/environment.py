"""Environment fingerprint: what hardware and software produced a number.

``relflow.host_fingerprint`` hashes only the hardware part (CPU model, its ISA extensions,
cores, RAM, GPU), so runs on the same kind of machine group together across software
upgrades, and hosts with different vector units (AVX-512, AMX) never do
(tasks/measure/host_env.py; the governor and boost are tagged, not hashed: they are settings).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import platform
import socket
import subprocess
from collections.abc import Iterable
from pathlib import Path

import psutil
import torch

from tasks.measure.host_env import cpu_flags, host_tags


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[2],
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _version(pkg: str) -> str:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return "absent"


HARNESS_PACKAGES = ("prefect", "mlflow", "polars", "pyarrow", "duckdb")  # what every run stands on


def fingerprint(device: torch.device, packages: Iterable[str] = ()) -> dict[str, str]:
    """The host, device, versions and thread settings of a run. ``packages``: the models under
    test's distributions (each ``Library.packages``; a run tags every registered library's, whichever
    one ran: tasks/libraries ``library_packages``) beside the harness's own."""
    gpu, driver = "none", "none"
    if device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
        try:
            driver = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                )
                .stdout.strip()
                .splitlines()[0]
            )
        except (OSError, subprocess.SubprocessError, IndexError):
            driver = "unknown"
    hardware = {
        "relflow.cpu_model": _cpu_model(),
        "relflow.cpu_flags": ",".join(cpu_flags()) or "none",
        "relflow.cpu_count": str(os.cpu_count()),
        "relflow.ram_bytes": str(psutil.virtual_memory().total),
        "relflow.gpu_name": gpu,
    }
    sha = _git("rev-parse", "HEAD") or "unknown"
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    tags = {
        **host_tags(),
        **hardware,
        "relflow.host_fingerprint": hashlib.sha256(repr(sorted(hardware.items())).encode()).hexdigest()[:16],
        "relflow.gpu_driver": driver,
        "relflow.host": socket.gethostname(),
        "relflow.device": str(device),
        "relflow.git_sha": sha,
        "relflow.git_dirty": str(dirty).lower(),
        "relflow.python_version": platform.python_version(),
        "relflow.torch_version": torch.__version__,
        "relflow.torch_threads": str(torch.get_num_threads()),
        "relflow.omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
    }
    worker = os.environ.get("PREFECT__WORKER_NAME")  # set by a Prefect worker for its flow runs
    if worker:
        tags["relflow.worker"] = worker
    for pkg in dict.fromkeys([*HARNESS_PACKAGES, *packages]):
        tags[f"relflow.{pkg.replace('-', '_')}_version"] = _version(pkg)
    return tags


def host_load_per_core() -> float:
    """The 1-minute load average divided by the core count (1.0 = every core busy)."""
    return os.getloadavg()[0] / (os.cpu_count() or 1)
