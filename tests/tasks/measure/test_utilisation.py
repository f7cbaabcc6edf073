"""MFU: the FLOPs count checked against a hand count, the present work counted apart from the
reserved shape, and a utilisation above 1 INVALID with a reason."""

from __future__ import annotations

from collections import Counter

import torch

from model import ColumnDef, ModelConfig, ModelSchema, NodeDef, TargetDef
from model.meta import inspect_on_meta
from tasks.measure.clock import Clock
from tasks.measure.present_flops import cut, flops_of_shapes
from tasks.measure.utilisation import PhaseWork, mfu_metrics, utilisation_reasons
from tasks.run.peak_flops import Peak, measure, peak_flops


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


def test_the_peak_is_the_best_of_its_timed_matmuls_at_2_n_cubed_flops(monkeypatch):
    # Three timed 64 x 64 x 64 matmuls on a scripted clock: 0.5, 0.25 and 0.4 s. The peak is
    # the best one's rate, 2 * 64**3 FLOPs in 0.25 s (not the mean, not n**3 FLOPs).
    ticks = iter([0.0, 0.5, 1.0, 1.25, 2.0, 2.4])
    monkeypatch.setattr("tasks.run.peak_flops.Clock", lambda device: Clock(None, now=lambda: next(ticks)))
    peak = measure(torch.device("cpu"), "fp32", size=64, reps=3)
    assert peak.flops_per_s == 2 * 64**3 / 0.25
    assert (peak.size, peak.threads, peak.device, peak.dtype) == (64, torch.get_num_threads(), "cpu", "fp32")
    # MFU against it: three such matmuls (3 x 0.25 s of work at the peak rate) done in 1.5 s
    m = mfu_metrics(peak.flops_per_s, {"predict": PhaseWork(0.0, 0.0, 3 * 2 * 64**3, 1.5)})
    assert m["compute.mfu"] == 0.5
    assert m["compute.model_flops_per_s"] == 3 * 2 * 64**3 / 1.5


def test_a_measured_peak_is_cached_per_host_device_and_dtype(tmp_path, monkeypatch):
    monkeypatch.setenv("RELFLOW_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("tasks.run.peak_flops.BUSY_HOST_FRACTION", 1.0)  # caching itself, whatever else runs
    measured: list[float] = []

    def scripted_measure(device: torch.device, dtype: str, size: int | None = None, reps: int = 8) -> Peak:
        measured.append(100.0 * (len(measured) + 1))  # each measurement a new figure: 100, 200, ...
        return Peak(measured[-1], str(device), dtype, torch.get_num_threads(), 8, 0.0)

    monkeypatch.setattr("tasks.run.peak_flops.measure", scripted_measure)
    cpu = torch.device("cpu")
    peak = peak_flops("fp-test", cpu, "fp32")
    assert (peak.cached, peak.flops_per_s) == (False, 100.0)
    again = peak_flops("fp-test", cpu, "fp32")  # from the cache file, not measured
    assert (again.cached, again.flops_per_s, len(measured)) == (True, 100.0, 1)
    assert peak_flops("fp-test", cpu, "bf16").flops_per_s == 200.0  # another dtype: measured
    assert peak_flops("fp-other-host", cpu, "fp32").flops_per_s == 300.0  # another host
    fresh = peak_flops("fp-test", cpu, "fp32", remeasure=True)
    assert (fresh.cached, fresh.flops_per_s) == (False, 400.0)
    assert peak_flops("fp-test", cpu, "fp32").flops_per_s == 400.0  # the remeasured figure is cached


def test_mfu_counts_the_present_work_and_the_reserved_figure_apart():
    # reserved: 100 FLOPs/row x 10 rows/s; present: 250 FLOPs in 0.5 s; peak 1,000 FLOP/s
    work = PhaseWork(reserved_flops_per_row=100.0, steady_rows_per_s=10.0, present_flops=250.0, steady_seconds=0.5)
    m = mfu_metrics(1000.0, {"predict": work, "train": work})
    assert m["compute.model_flops_per_s"] == 500.0 and m["compute.mfu"] == 0.5
    assert m["compute.model_flops_per_s_reserved"] == 1000.0 and m["compute.mfu_reserved"] == 1.0
    assert m["compute.train.mfu"] == 1.5 and m["compute.train.mfu_reserved"] == 3.0  # 3x forward
    reasons = utilisation_reasons(m)
    assert len(reasons) == 2  # train's two figures; 1.0 itself is not above 1
    assert reasons[0].startswith("compute.train.mfu 1.50 > 1: compute.train.model_flops_per_s 1.5e+03 FLOP/s")
    assert "host.peak_flops_per_s 1e+03" in reasons[0]
    assert reasons[1].startswith("compute.train.mfu_reserved 3.00 > 1")


def test_present_flops_count_each_root_row_at_its_own_shape():
    cols = (ColumnDef("x", "numeric"), ColumnDef("y", "category", 5))
    branch = NodeDef("b", (ColumnDef("v", "numeric"),), max_length=8)
    schema = ModelSchema(NodeDef("r", cols, children=(branch,)), TargetDef("r", "y", "category", 3))
    cfg = ModelConfig(d_model=8, layers=1, heads=2)

    def per_row(length: int) -> float:
        return float(inspect_on_meta(cut(schema, (length,)), cfg, outputs=("prediction",))["flops_per_root_row"])

    assert per_row(8) == inspect_on_meta(schema, cfg, outputs=("prediction",))["flops_per_root_row"]
    assert per_row(2) < per_row(8)
    shapes = Counter({(2,): 3, (8,): 1, (0,): 2})  # an empty branch keeps one slot
    assert flops_of_shapes(schema, cfg, ("prediction",), shapes) == 3 * per_row(2) + per_row(8) + 2 * per_row(1)


def test_present_flops_inspect_each_shape_once_per_process(monkeypatch):
    """Train and predict count the same shapes: one meta-device inspection each, not one per
    phase, and the same figures as inspecting every time."""
    import tasks.measure.present_flops as pf

    cols = (ColumnDef("x", "numeric"), ColumnDef("y", "category", 5))
    branch = NodeDef("b", (ColumnDef("v", "numeric"),), max_length=6)
    schema = ModelSchema(NodeDef("r", cols, children=(branch,)), TargetDef("r", "y", "category", 3))
    cfg = ModelConfig(d_model=8, layers=1, heads=2, ffn_mult=3)  # a config no other test counts
    calls = []
    monkeypatch.setattr(pf, "inspect_on_meta", lambda *a, **k: calls.append(a[0]) or inspect_on_meta(*a, **k))
    shapes = Counter({(2,): 3, (5,): 1})
    first = flops_of_shapes(schema, cfg, ("prediction",), shapes)
    again = flops_of_shapes(schema, cfg, ("prediction",), Counter({(5,): 4, (2,): 1}))
    assert len(calls) == 2  # (2,) and (5,), once each
    per_row = {
        n: inspect_on_meta(cut(schema, (n,)), cfg, outputs=("prediction",))["flops_per_root_row"] for n in (2, 5)
    }
    assert first == 3 * per_row[2] + per_row[5] and again == 4 * per_row[5] + per_row[2]
    flops_of_shapes(schema, cfg, ("prediction", "root_embedding"), shapes)  # other outputs: counted anew
    assert len(calls) == 4


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


def test_ddp_train_mfu_is_against_the_peak_at_the_ranks_thread_count():
    # Before: the ranks' training (1 thread each) was divided by the flow's 2-thread peak.
    work = PhaseWork(reserved_flops_per_row=100.0, steady_rows_per_s=1.0, present_flops=250.0, steady_seconds=0.5)
    m = mfu_metrics(1000.0, {"predict": work, "train": work}, train_rank_peak=500.0)
    assert m["compute.mfu"] == 0.5  # 500 FLOP/s over the host's 1,000
    assert m["compute.train.mfu"] == 3.0  # 1,500 FLOP/s over the rank's 500
    assert m["compute.train.rank_peak_flops_per_s"] == 500.0
    (reason, *_) = utilisation_reasons(m)
    assert "compute.train.rank_peak_flops_per_s 500" in reason


def test_a_peak_at_another_thread_count_is_measured_there_and_threads_restored(tmp_path, monkeypatch):
    monkeypatch.setenv("RELFLOW_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("tasks.run.peak_flops.BUSY_HOST_FRACTION", 1.0)
    before = torch.get_num_threads()
    one = peak_flops("fp-threads", torch.device("cpu"), "fp32", threads=1)
    assert one.threads == 1 and torch.get_num_threads() == before
    import json

    keys = list(json.loads((tmp_path / "peak_flops.json").read_text()))
    assert keys == ["fp-threads|cpu|fp32|threads=1"]
