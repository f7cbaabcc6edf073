"""``torch.profiler`` over a few steady batches of each compute phase.

Never the first call or warm-up (compilation and allocator growth would dominate), and only
``run.profile_batches`` batches per phase, because profiling slows every op it records: a
profiled run is tagged ``relflow.profiled=true`` and history/compare leave it out by default.
Per phase it leaves a Chrome/Perfetto trace and a top-ops table (self time, calls, share).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile


@dataclass
class SteadyProfiler:
    enabled: bool
    batches: int
    device: torch.device
    traces: dict[str, Path] = field(default_factory=dict)
    top_ops: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _active: dict[str, Any] = field(default_factory=dict)
    _count: dict[str, int] = field(default_factory=dict)
    _folder: Path | None = None  # made on the first export: an unprofiled run leaves nothing in /tmp

    def _export(self, phase: str, prof: Any) -> None:
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="relflow-profile-"))
        self.traces[phase] = self._folder / f"trace_{phase}.json"
        prof.export_chrome_trace(str(self.traces[phase]))
        self.top_ops[phase] = top_ops(prof, self.device.type == "cuda")

    def cleanup(self) -> None:
        """Delete the exported traces (after they are logged as artifacts)."""
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    @contextmanager
    def batch(self, phase: str, steady: bool) -> Iterator[None]:
        """Wrap one batch's step; records it when it is one of the phase's first steady ones."""
        if not self.enabled or not steady or self._count.get(phase, 0) >= self.batches:
            with nullcontext():
                yield
            return
        prof = self._active.get(phase)
        if prof is None:
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
            prof = self._active[phase] = profile(activities=acts, record_shapes=True)
            prof.start()
        yield
        self._count[phase] = self._count.get(phase, 0) + 1
        if self._count[phase] == self.batches:
            prof.stop()
            del self._active[phase]
            self._export(phase, prof)

    def close(self) -> None:
        """Stop a phase that ended before reaching ``batches`` (its partial table still counts)."""
        for phase, prof in list(self._active.items()):
            prof.stop()
            self._export(phase, prof)
        self._active.clear()


def top_ops(prof: Any, cuda: bool, limit: int = 30) -> list[dict[str, Any]]:
    """Ops by self time (device time on CUDA, else CPU), with calls and share of the total."""
    events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]

    def self_us(e: Any) -> float:
        return float(e.self_device_time_total if cuda else e.self_cpu_time_total)

    total = sum(self_us(e) for e in events) or 1.0
    rows = sorted(events, key=self_us, reverse=True)[:limit]
    return [
        {
            "op": e.key,
            "calls": int(e.count),
            "self_cpu_ms": e.self_cpu_time_total / 1e3,
            "self_cuda_ms": float(getattr(e, "self_device_time_total", 0.0)) / 1e3,
            "share": self_us(e) / total,
        }
        for e in rows
    ]


def to_markdown(table: list[dict[str, Any]], limit: int = 10) -> str:
    lines = ["| op | calls | self CPU ms | self CUDA ms | share |", "|---|---|---|---|---|"]
    for r in table[:limit]:
        lines.append(
            f"| {r['op']} | {r['calls']} | {r['self_cpu_ms']:.2f} | {r['self_cuda_ms']:.2f} | {r['share']:.1%} |"
        )
    return "\n".join(lines)
