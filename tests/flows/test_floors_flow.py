"""A real run against its floor ledger: floor.<stage>.fraction logged next to the stage
figures, recomputable from the logged bytes, seconds and floors, and the CLI's "vs floor"
column. Slow: one small run of the default workload under the session's Prefect harness,
with the floors measured after its timed region (a private cache starts empty).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tasks.measure import keys as K
from tasks.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SPEC = REPO / "benchmarks" / "tpch_orders.yaml"
SMALL = [
    "model.d_model=16",
    "model.layers=1",
    "model.heads=2",
    "run.epochs=1",
    "run.batch_size=512",
    "run.chunk_rows=10000",
    "run.device=cpu",
    "run.repeats=2",
]


@pytest.fixture(scope="module")
def floors_run(prefect_harness, tpch_small, tmp_path_factory):
    from flows.benchmark import benchmark

    folder = tmp_path_factory.mktemp("floors")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.setenv("RELFLOW_CACHE_DIR", str(folder / "cache"))
        summary = benchmark(spec=load_spec(DEFAULT_SPEC, SMALL).to_dict(), spec_dir=str(DEFAULT_SPEC.parent))
    return summary, MlflowClient(tracking_uri=uri).get_run(summary["run_id"]).data.metrics


@pytest.mark.slow
def test_every_floor_fraction_is_logged_and_means_what_it_says(floors_run):
    _, m = floors_run
    for stage in K.FLOOR_STAGES:
        assert m[K.floor_fraction(stage)] > 0, stage
        assert m[K.floor_rate(stage)] > 0, stage
    assert m[K.FLOOR_CACHED] == 0.0  # a private, empty cache: measured after this run's region
    # every byte retrieve read is charged to a phase; write's are the kept file x passes
    assert m["stage.retrieve.predict.bytes"] + m["stage.retrieve.train.bytes"] == m[K.DATA_BYTES_READ]
    assert m["stage.write.predict.bytes"] == m[K.OUTPUT_BYTES] * m[K.E2E_PREDICT_PASSES]
    for stage in ("retrieve", "tensorize", "write"):
        rate = m[f"stage.{stage}.predict.bytes"] / m[f"stage.{stage}.predict.seconds"]
        assert m[K.floor_fraction(stage)] == pytest.approx(rate / m[K.floor_rate(stage)], rel=1e-9)
    assert m[K.FLOOR_PREPROCESS_SHARE] == pytest.approx(
        m["stage.preprocess.predict.seconds"] / m[K.E2E_PREDICT_SECONDS], rel=1e-9
    )
    assert not [k for k in m if not K.documented(k)]


@pytest.mark.slow
def test_the_stage_table_has_a_vs_floor_column(floors_run):
    from flows.cli.app import report
    from flows.cli.common import out

    summary, m = floors_run
    with out.capture() as cap:
        report(summary)
    text = cap.get()
    assert "vs floor" in text
    write_line = next(line for line in text.splitlines() if "predict" in line and "write" in line)
    assert f"{m[K.floor_fraction('write')]:.1%}" in write_line
