"""Figures compare like with like: no median over runs that differ in another param, and
bars are labelled by configuration (sweep tags), not by run id."""

from __future__ import annotations

from dashboards.figures import compile_groups, first_call_vs_steady, stage_breakdown
from tasks.measure.keys import STAGES
from tasks.tracking.reader import StoredRun


def rec(i: int, batch: str, packing: str, compiled: bool, steady: float, tags=None) -> StoredRun:
    params = {
        "run.batch_size": batch,
        "run.packing": packing,
        "run.compile.encoders": str(compiled),
        "run.compile.pools": "False",
    }
    metrics = {
        "e2e.predict.rows_per_s": 1.0,
        "compute.steady_rows_per_s": steady,
        "compute.first_call_seconds": 1.0,
        **{f"stage.{s}.predict.seconds": 0.1 for s in ("retrieve", "preprocess", "tensorize", "compute", "write")},
    }
    return StoredRun(f"id{i:030d}", f"run{i}", "e", "FINISHED", i, i + 1, metrics, params, tags or {})


def test_eager_vs_compiled_never_pools_batch_sizes():
    runs = [
        rec(0, "64", "auto", False, 100.0),
        rec(1, "1024", "auto", False, 10_000.0),
        rec(2, "64", "auto", True, 120.0),
        rec(3, "1024", "auto", True, 12_000.0),
    ]
    groups = compile_groups(runs)
    assert set(groups) == {("64",), ("1024",)}
    assert {v: len(rs) for v, rs in groups[("64",)].items()} == {"eager": 1, "encoders": 1}
    fig = first_call_vs_steady(runs)
    steady = [t for t in fig.data if t.xaxis == "x2"]
    # one series per batch size, each with its own eager and compiled bar: no 5,050 rows/s
    assert sorted(tuple(t.y) for t in steady) == [(100.0, 120.0), (10_000.0, 12_000.0)]
    assert {t.name for t in steady} == {"batch_size=64", "batch_size=1024"}


def test_stage_bars_are_labelled_by_sweep_configuration():
    runs = [
        rec(0, "64", "auto", False, 1.0, {"relflow.sweep.run.batch_size": "64", "relflow.sweep.run.packing": "auto"}),
        rec(1, "256", "off", False, 1.0, {"relflow.sweep.run.batch_size": "256", "relflow.sweep.run.packing": "off"}),
    ]
    fig = stage_breakdown(runs)
    assert list(fig.data[0].x) == ["batch_size=64, packing=auto", "batch_size=256, packing=off"]
    assert [t.name for t in fig.data] == list(STAGES)
