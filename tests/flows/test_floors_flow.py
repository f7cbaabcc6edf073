"""A real run against its floor ledger: floor.<stage>.fraction logged next to the stage
figures and their warm part (the pass after the first, which holds no first call), and the
CLI's "vs floor" column. Slow: one small run of the default workload under the session's Prefect harness,
with the floors measured after its timed region (a private cache starts empty).
"""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from tasks.measure import keys as K
from tasks.spec import load_spec
from tests.repo import REPO, SMALL_RUN

DEFAULT_SPEC = REPO / "benchmarks" / "tpch_orders.yaml"
OVERRIDES = [*SMALL_RUN, "run.chunk_rows=10000", "run.repeats=2"]


@pytest.fixture(scope="module")
def floors_run(prefect_harness, tpch_small, tmp_path_factory):
    from flows.benchmark import benchmark

    folder = tmp_path_factory.mktemp("floors")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.setenv("RELFLOW_CACHE_DIR", str(folder / "cache"))
        # Every ledger counts as a busy host's for the trust verdict (not for caching), so the
        # run must carry the untrusted tag whatever else this host is doing.
        mp.setattr("tasks.measure.floor_trust.BUSY_HOST_FRACTION", -1.0)
        summary = benchmark(spec=load_spec(DEFAULT_SPEC, OVERRIDES).to_dict(), spec_dir=str(DEFAULT_SPEC.parent))
    data = MlflowClient(tracking_uri=uri).get_run(summary["run_id"]).data
    return summary, data.metrics, data.tags


@pytest.mark.slow
def test_every_floor_fraction_is_logged_and_means_what_it_says(floors_run):
    _, m, _ = floors_run
    assert m[K.FLOOR_CACHED] == 0.0  # a private, empty cache: measured after this run's region
    passes = m[K.E2E_PREDICT_PASSES]
    assert passes == 2
    # each fraction is the stage's warm rate over its floor's, recomputed from the run's own figures
    warm = {s: m[K.stage_warm_seconds(s)] for s in ("retrieve", "tensorize", "write")}
    rates = {
        "retrieve": m[K.stage_warm_bytes("retrieve")] / warm["retrieve"],
        "tensorize": m[K.stage_warm_bytes("tensorize")] / warm["tensorize"],
        "write": m[K.OUTPUT_BYTES] * (passes - 1) / warm["write"],  # every pass writes the same file
        "compute": m[K.compute("predict", K.MODEL_FLOPS_PER_S)],
    }
    for stage, rate in rates.items():
        assert m[K.floor_fraction(stage)] == pytest.approx(rate / m[K.floor_rate(stage)], rel=1e-9), stage
    assert K.floor_fraction("orchestration") in m
    assert K.floor_fraction("preprocess") not in m  # only time-anchored roots have the as-of floor
    # every byte retrieve read is charged to a phase; write's are the kept file x passes
    assert m["stage.retrieve.predict.bytes"] + m["stage.retrieve.train.bytes"] == m[K.DATA_BYTES_READ]
    assert m["stage.write.predict.bytes"] == m[K.OUTPUT_BYTES] * passes
    # the warm figures are the passes after the first: tensorize makes the same tensors every
    # pass, so one pass of two holds half its bytes...
    assert m[K.stage_warm_bytes("tensorize")] == m["stage.tensorize.predict.bytes"] / passes
    # ...and pass 0, which the warm figures leave out, holds the first call
    warm = sum(m[K.stage_warm_seconds(s)] for s in K.PHASE_STAGES["predict"])
    assert warm > 0 and m[K.E2E_PREDICT_SECONDS] - warm >= m[K.FIRST_CALL_SECONDS]
    assert m[K.FLOOR_PREPROCESS_SHARE] < 1.0
    assert not [k for k in m if not K.documented(k)]


@pytest.mark.slow
def test_the_stage_table_has_a_vs_floor_column(floors_run):
    from flows.cli.app import report
    from flows.cli.common import out

    summary, m, _ = floors_run
    with out.capture() as cap:
        report(summary)
    text = cap.get()
    assert "vs floor" in text
    write_line = next(line for line in text.splitlines() if "predict" in line and "write" in line)
    assert f"{m[K.floor_fraction('write')]:.1%}" in write_line


@pytest.mark.slow
def test_a_busy_hosts_ledger_tags_the_run_and_marks_the_column_but_leaves_it_valid(floors_run):
    from flows.cli.app import report
    from flows.cli.common import out

    summary, m, tags = floors_run
    other = m[K.FLOOR_OTHER_CPU_FRACTION]
    assert tags["relflow.floor.untrusted"].startswith(f"floor.other_cpu_fraction {other:.2f} > -1.0")
    assert tags["relflow.validity"] == "VALID" or "floor" not in tags["relflow.invalid_reasons"]
    # the CLI on the same run with the busy-host figures: every cell marked, reasons below
    busy = {**summary, "metrics": {**m, K.FLOOR_OTHER_CPU_FRACTION: 0.37, K.floor_fraction("compute"): 1.51}}
    with out.capture() as cap:
        report(busy)
    text = cap.get()
    compute_line = next(line for line in text.splitlines() if "predict" in line and "compute" in line)
    assert "151.0%*" in compute_line
    joined = " ".join(text.split())  # rich wraps the note at the console's width
    assert "* vs floor untrusted: floor.other_cpu_fraction 0.37 > 0.1" in joined
    assert "floor.compute.fraction 1.51 > 1" in joined
