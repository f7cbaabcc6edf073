"""MFU: the FLOPs count checked against a hand count, and utilisation in (0, 1]."""

from __future__ import annotations

import pytest
import torch

from model import ColumnDef, ModelConfig, ModelSchema, NodeDef, TargetDef
from model.meta import inspect_on_meta
from tasks.measure.peak import measure, peak_flops
from tasks.measure.utilisation import mfu_metrics


def test_flops_per_root_row_matches_a_hand_count():
    # Root only, categorical columns (embedding lookups cost no FLOPs), mean reduce: the
    # matmul work is the encoder stack over S tokens plus the prediction head.
    S, D, F, L, classes = 4, 8, 2, 1, 3
    cols = tuple(ColumnDef(f"c{i}", "category", 5) for i in range(S - 1)) + (ColumnDef("y", "category", 5),)
    schema = ModelSchema(NodeDef("r", cols), TargetDef("r", "y", "category", classes))
    got = inspect_on_meta(schema, ModelConfig(d_model=D, layers=L, heads=2, ffn_mult=F), outputs=("prediction",))
    per_layer = (
        2 * S * D * 3 * D  # qkv projection
        + 2 * S * S * D  # q @ k^T over all heads
        + 2 * S * S * D  # attention weights @ v
        + 2 * S * D * D  # output projection
        + 2 * S * D * F * D * 2  # feed-forward up and down
    )
    assert got["flops_per_root_row"] == L * per_layer + 2 * D * classes


def test_mfu_is_a_fraction_of_a_measured_peak(tmp_path, monkeypatch):
    monkeypatch.setenv("RELFLOW_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("tasks.measure.peak.BUSY_HOST_FRACTION", 1.0)  # caching itself, whatever else runs
    cpu = torch.device("cpu")
    peak = peak_flops("fp-test", cpu, "fp32")
    assert not peak.cached and peak.flops_per_s > 0
    again = peak_flops("fp-test", cpu, "fp32")
    assert again.cached and again.flops_per_s == peak.flops_per_s
    assert not peak_flops("fp-test", cpu, "fp32", remeasure=True).cached
    # A real workload-sized matmul cannot beat the best rate of the same kernel at its size.
    small = measure(cpu, "fp32", size=256, reps=3)
    m = mfu_metrics(
        peak.flops_per_s, {"predict": (2.0 * 256**3, 1.0 / 0.5), "train": (small.flops_per_s / 3.0 / 10.0, 1.0)}
    )
    assert 0 < m["compute.mfu"] <= 1
    assert m["compute.train.model_flops_per_s"] == pytest.approx(small.flops_per_s / 10.0)
    assert 0 < m["compute.train.mfu"] <= 1


def test_a_peak_measured_on_a_busy_host_is_not_cached(tmp_path, monkeypatch):
    """Other processes (not this one's children: those count as the run's own work) busy on
    every core: the peak is measured for this call but the next call measures again."""
    import os
    import signal
    import subprocess
    import sys
    import time

    monkeypatch.setenv("RELFLOW_CACHE_DIR", str(tmp_path))
    burn = "import time\nt = time.time() + 60\nwhile time.time() < t: pass"
    pids = tmp_path / "pids"
    # `sh` exits at once, so the burners are re-parented: other processes, as far as we know.
    cores = os.cpu_count() or 1
    launch = " ".join(f"{sys.executable} -c '{burn}' & echo $! >> {pids};" for _ in range(cores))
    subprocess.run(["sh", "-c", launch], check=True)
    try:
        time.sleep(0.5)
        peak = peak_flops("fp-busy", torch.device("cpu"), "fp32")
        assert peak.other_cpu_fraction > 0.1
        assert not peak_flops("fp-busy", torch.device("cpu"), "fp32").cached
    finally:
        for pid in pids.read_text().split():
            os.kill(int(pid), signal.SIGKILL)
