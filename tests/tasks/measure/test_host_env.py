"""The host settings that make figures differ: ISA flags (hashed into the host fingerprint),
governor and boost (tagged), and steal time over the region, on hand-made inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.measure.host_env import CpuTicks, boost, cpu_flags, governor, host_tags, steal_fraction

INTEL = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 amx_tile amx_bf16 amx_int8
"""
EPYC = """processor\t: 0
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx avx2 fma
"""


def test_isa_flags_are_the_listed_extensions_in_a_fixed_order():
    assert cpu_flags(INTEL) == (
        "avx2",
        "fma",
        "avx512f",
        "avx512bw",
        "avx512_vnni",
        "avx512_bf16",
        "amx_tile",
        "amx_bf16",
        "amx_int8",
    )
    assert cpu_flags(EPYC) == ("avx2", "fma")
    assert cpu_flags("processor : 0\n") == ()


def test_governor_and_boost_read_sysfs_or_say_unreadable(tmp_path: Path):
    assert (governor(tmp_path), boost(tmp_path)) == ("unreadable", "unreadable")
    (tmp_path / "cpu0" / "cpufreq").mkdir(parents=True)
    (tmp_path / "cpu0" / "cpufreq" / "scaling_governor").write_text("performance\n")
    (tmp_path / "intel_pstate").mkdir()
    (tmp_path / "intel_pstate" / "no_turbo").write_text("1\n")
    assert (governor(tmp_path), boost(tmp_path)) == ("performance", "off")
    (tmp_path / "cpufreq").mkdir()
    (tmp_path / "cpufreq" / "boost").write_text("1\n")  # acpi-cpufreq's switch wins
    assert boost(tmp_path) == "on"
    assert host_tags(EPYC, tmp_path) == {
        "relflow.cpu_flags": "avx2,fma",
        "relflow.cpu_governor": "performance",
        "relflow.cpu_boost": "on",
    }


def test_steal_fraction_is_stolen_over_all_cores_time():
    # 2 cores x 10 s = 20 core-seconds passed, 3 of them stolen
    assert steal_fraction(CpuTicks(100.0, 5.0), CpuTicks(120.0, 8.0)) == pytest.approx(0.15)
    assert steal_fraction(CpuTicks(100.0, 5.0), CpuTicks(100.0, 5.0)) == 0.0
    now = CpuTicks.now()
    assert now.total > 0 and 0.0 <= now.steal <= now.total


def test_unlike_cpu_flags_are_unlike_host_fingerprints(monkeypatch):
    import torch

    from tasks.measure import environment

    monkeypatch.setattr(environment, "cpu_flags", lambda: cpu_flags(INTEL))
    intel = environment.fingerprint(torch.device("cpu"))
    monkeypatch.setattr(environment, "cpu_flags", lambda: cpu_flags(EPYC))
    epyc = environment.fingerprint(torch.device("cpu"))
    assert intel["relflow.host_fingerprint"] != epyc["relflow.host_fingerprint"]
    assert epyc["relflow.cpu_flags"] == "avx2,fma"


def test_compare_says_when_the_hosts_are_unlike():
    from dashboards.compare import compare
    from tasks.tracking.reader import StoredRun

    def run(i: str, host: str, flags: str) -> StoredRun:
        tags = {"relflow.host_fingerprint": host, "relflow.cpu_flags": flags}
        return StoredRun(i, "r", "e", "FINISHED", 0, 1, {"e2e.predict.rows_per_s": 100.0}, {}, tags)

    c = compare([run("a", "h1", "avx2,avx512f,amx_tile")], [run("b", "h2", "avx2")])
    (note,) = [n for n in c.notes if "unlike hosts" in n]
    assert "relflow.cpu_flags avx2,avx512f,amx_tile vs avx2" in note
    same = compare([run("a", "h1", "avx2")], [run("b", "h1", "avx2")])
    assert not [n for n in same.notes if "unlike hosts" in n]
