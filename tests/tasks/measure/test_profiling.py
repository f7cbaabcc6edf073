"""The steady-window profiler: never the first call or warm-up, a trace and a top-ops table."""

from __future__ import annotations

import json
import tempfile

import torch

from tasks.measure.profiling import SteadyProfiler, to_markdown


def test_profiles_only_the_first_steady_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    prof = SteadyProfiler(True, batches=2, device=torch.device("cpu"))
    lin = torch.nn.Linear(16, 16)
    x = torch.randn(8, 16)
    # first call and one warm-up batch: not steady, never recorded
    for steady in (False, False):
        with prof.batch("predict", steady):
            torch.relu(lin(x))
    assert "predict" not in prof.traces
    for _ in range(4):  # only the first two steady batches are recorded
        with prof.batch("predict", True):
            torch.relu(lin(x))
    prof.close()
    trace = json.loads(prof.traces["predict"].read_text())
    names = [e.get("name") for e in trace["traceEvents"]]
    assert names.count("aten::relu") == 2  # two batches, not the warm-up ones nor the later ones
    ops = {r["op"]: r for r in prof.top_ops["predict"]}
    assert ops["aten::relu"]["calls"] == 2
    assert abs(sum(r["share"] for r in prof.top_ops["predict"]) - 1.0) < 0.05
    assert "aten::addmm" in to_markdown(prof.top_ops["predict"], limit=30)
    assert prof.traces["predict"].parent.parent == tmp_path
    prof.cleanup()  # once logged, the traces' folder goes
    assert list(tmp_path.glob("relflow-profile-*")) == []


def test_disabled_profiler_records_nothing_and_leaves_no_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    prof = SteadyProfiler(False, batches=2, device=torch.device("cpu"))
    with prof.batch("train", True):
        torch.ones(3).sum()
    prof.close()
    prof.cleanup()
    assert prof.traces == {} and prof.top_ops == {}
    assert list(tmp_path.glob("relflow-profile-*")) == []  # every unprofiled run made one of these in /tmp
