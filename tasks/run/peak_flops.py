"""The host's peak matmul rate: the denominator of model FLOPs utilisation (MFU).

A dense square matmul on the run's device, dtype and thread count is about the best rate
this hardware reaches on real work, so ``achieved / peak`` says how far a workload is from
the machine's limit. Measured once per (host fingerprint, device, dtype, threads) and cached
in a small JSON file (``$RELFLOW_CACHE_DIR``, default ``~/.cache/relflow-bench``), because
re-measuring costs seconds of full load; ``relflow-bench peak --remeasure`` refreshes it.
A peak measured while other processes held the cores is far too low (12.8 instead of ~180
GFLOP/s was seen on this 2-core host under load) and would inflate every later MFU, so it is
used for that run only and never cached.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tasks.measure.clock import Clock, unix_time
from tasks.measure.hostload import BUSY_HOST_FRACTION, OtherCpu
from tasks.runtime import interrupts
from tasks.runtime.threads import intra_op_threads

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Peak:
    flops_per_s: float
    device: str
    dtype: str
    threads: int
    size: int  # n of the n x n x n matmul
    measured_unix_s: float
    other_cpu_fraction: float = 0.0  # share of the cores other processes used while measuring
    cached: bool = False


def cache_file() -> Path:
    base = os.environ.get("RELFLOW_CACHE_DIR") or Path.home() / ".cache" / "relflow-bench"
    return Path(base) / "peak_flops.json"


def _key(fingerprint: str, device: torch.device, dtype: str) -> str:
    return f"{fingerprint}|{device}|{dtype}|threads={torch.get_num_threads()}"


def measure(device: torch.device, dtype: str, size: int | None = None, reps: int = 8) -> Peak:
    """Best sustained rate of ``reps`` timed n x n x n matmuls after warm-up."""
    n = size or (8192 if device.type == "cuda" else 1024)
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=DTYPES[dtype])
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=DTYPES[dtype])
    clock = Clock(device)
    for _ in range(3):
        a @ b
    best = float("inf")
    other = OtherCpu().start()
    for _ in range(reps):
        with clock.measure() as span:
            a @ b
        best = min(best, span.seconds)
    busy = other.stop()
    return Peak(2.0 * n**3 / best, str(device), dtype, torch.get_num_threads(), n, unix_time(), busy)


def peak_flops(
    fingerprint: str, device: torch.device, dtype: str, remeasure: bool = False, threads: int | None = None
) -> Peak:
    """The cached peak for this host/device/dtype/threads, measured on a miss. ``threads``:
    the peak at that torch thread count (a DDP rank's), not this process's."""
    with intra_op_threads(threads):
        return _peak_flops(fingerprint, device, dtype, remeasure)


def _peak_flops(fingerprint: str, device: torch.device, dtype: str, remeasure: bool) -> Peak:
    path = cache_file()
    key = _key(fingerprint, device, dtype)
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    if not remeasure and key in cache:
        return Peak(**{**cache[key], "cached": True})
    peak = measure(device, dtype)
    if peak.other_cpu_fraction > BUSY_HOST_FRACTION:
        return peak  # a busy host's peak: this run only, measured again next time
    cache[key] = {k: v for k, v in asdict(peak).items() if k != "cached"}
    save_cache(path, cache)
    return peak


def save_cache(path: Path, cache: dict[str, Any]) -> None:
    """A per-host measurement cache (peak FLOPs, floor ledgers) written whole, atomically."""
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with interrupts.removed_on_exit(lambda: tmp.unlink(missing_ok=True)):  # a signal included
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(cache, indent=1))
            tmp.replace(path)  # concurrent writers: last one wins, never a torn file
        except OSError:
            pass  # an unwritable cache only costs a re-measurement next time
