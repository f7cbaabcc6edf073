"""The host settings that make one machine's figures differ from another's, or one run's from
the next: instruction-set extensions, the frequency governor and boost, and steal time.

- **ISA flags** (AVX2, AVX-512 families, AMX): the same code ran 2.4x slower on an AMD EPYC
  VM without AVX-512/AMX than on the previous Intel one. They are hardware, so they enter
  ``relflow.host_fingerprint`` (tasks/measure/environment.py): history and compare group
  runs by fingerprint, and never put hosts with different vector units side by side unasked.
- **Governor and boost** (``/sys/devices/system/cpu``): settings, not hardware; tagged
  (``relflow.cpu_governor``, ``relflow.cpu_boost``) so a difference is listed by compare as
  an explanation. ``unreadable`` where the VM exposes no cpufreq (most cloud VMs).
- **Steal time** (``/proc/stat``): CPU the hypervisor gave to another guest while this run
  wanted it. ``host.steal_fraction`` is the share of all cores' time stolen over the timed
  region; it is also inside ``host.other_cpu_fraction`` (stolen time is not ours).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil

# The extensions that change which kernels torch and ONNX Runtime pick, in this order.
ISA_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
UNREADABLE = "unreadable"
CPU_SYSFS = Path("/sys/devices/system/cpu")


def cpu_flags(cpuinfo: str | None = None) -> tuple[str, ...]:
    """The ``ISA_FLAGS`` the first CPU of ``/proc/cpuinfo`` has (empty where it has no flags)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return ()
    for line in cpuinfo.splitlines():
        if line.startswith(("flags", "Features")):  # x86 / arm64
            have = set(line.split(":", 1)[1].split())
            return tuple(f for f in ISA_FLAGS if f in have)
    return ()


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def governor(root: Path = CPU_SYSFS) -> str:
    """cpu0's cpufreq governor (``performance``, ``powersave``, ...), or ``unreadable``."""
    return _read(root / "cpu0" / "cpufreq" / "scaling_governor") or UNREADABLE


def boost(root: Path = CPU_SYSFS) -> str:
    """``on`` / ``off`` from acpi-cpufreq's ``boost`` or intel_pstate's ``no_turbo``, else ``unreadable``."""
    value = _read(root / "cpufreq" / "boost")
    if value in ("0", "1"):
        return "on" if value == "1" else "off"
    no_turbo = _read(root / "intel_pstate" / "no_turbo")
    if no_turbo in ("0", "1"):
        return "off" if no_turbo == "1" else "on"
    return UNREADABLE


def host_tags(cpuinfo: str | None = None, root: Path = CPU_SYSFS) -> dict[str, str]:
    """Tags for the run: ISA flags (also hashed into the host fingerprint), governor, boost."""
    return {
        "relflow.cpu_flags": ",".join(cpu_flags(cpuinfo)) or "none",
        "relflow.cpu_governor": governor(root),
        "relflow.cpu_boost": boost(root),
    }


@dataclass(frozen=True)
class CpuTicks:
    """All cores' CPU seconds since boot: the total over every state, and the stolen part."""

    total: float
    steal: float

    @classmethod
    def now(cls) -> CpuTicks:
        t = psutil.cpu_times()
        # guest time is already inside user time on Linux
        total = sum(getattr(t, f) for f in t._fields if f not in ("guest", "guest_nice"))
        return cls(float(total), float(getattr(t, "steal", 0.0)))


def steal_fraction(before: CpuTicks, after: CpuTicks) -> float:
    """Share of all cores' time stolen between two readings (0 when no time passed)."""
    total = after.total - before.total
    return max(0.0, after.steal - before.steal) / total if total > 0 else 0.0
