"""A failing run ends FAILED in MLflow whatever its cleanup does (issue 24 item 6).

The prediction writer used to be aborted before the run was ended: an abort that raised (a
full disk) left the run RUNNING. Here the real flow runs with a writer that fails like a
full disk on its writes, and whose abort then fails with an error of its own: the run must
end FAILED, and the error reported (raised and in ``relflow.error``) must be the write's,
which names the file and the fix, not the abort's. The memory sampler's start was outside
the run's ``try``: one that cannot start must end the run FAILED too.
"""

from __future__ import annotations

import errno

import pytest
from mlflow.tracking import MlflowClient

from tasks.runtime.errors import UserError

pytestmark = pytest.mark.slow  # real flow runs under the session's Prefect server

ABORT_ERROR = "abort failed: the disk went away"  # the cleanup's own error, never the one reported


def _runs(uri: str):
    client = MlflowClient(tracking_uri=uri)
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


def _predict_spec(shop_spec, tmp_path):
    return {**shop_spec, "run": {**shop_spec.get("run", {}), "mode": "predict", "output_dir": str(tmp_path / "out")}}


@pytest.fixture
def store(tmp_path, monkeypatch) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # a local file store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    return uri


def test_failing_run_is_ended_failed_even_when_the_writer_abort_raises(
    prefect_harness, shop_spec, shop_files, tmp_path, monkeypatch, store
):
    import flows.benchmark as flow_module
    from tasks.stages.write import PredictionWriter

    aborted = []

    class FullDisk(PredictionWriter):
        def write(self, table):
            raise OSError(errno.ENOSPC, "No space left on device")

        def abort(self):
            super().abort()
            aborted.append(self.path)
            raise OSError(errno.EIO, ABORT_ERROR)

    monkeypatch.setattr(flow_module, "PredictionWriter", FullDisk)
    with pytest.raises(UserError) as err:
        flow_module.benchmark(spec=_predict_spec(shop_spec, tmp_path), spec_dir=str(shop_files))
    assert aborted  # the abort ran, and raised
    msg = str(err.value)
    assert "Writing predictions to '" in msg and str(tmp_path / "out") in msg and "No space left on device" in msg
    assert "run.output_dir" in msg and ABORT_ERROR not in msg
    runs = _runs(store)
    assert [r.info.status for r in runs] == ["FAILED"]
    error = runs[0].data.tags["relflow.error"]
    assert "No space left on device" in error and ABORT_ERROR not in error
    assert not list((tmp_path / "out").glob("*.parquet"))


def test_a_memory_sampler_that_cannot_start_ends_the_run_failed(
    prefect_harness, shop_spec, shop_files, tmp_path, monkeypatch, store
):
    import flows.benchmark as flow_module
    from tasks.measure.memory import PeakMemory

    def cannot_start(self):
        raise PermissionError(errno.EACCES, "Permission denied: /proc/self/clear_refs")

    monkeypatch.setattr(PeakMemory, "start", cannot_start)
    with pytest.raises(PermissionError, match="clear_refs"):
        flow_module.benchmark(spec=_predict_spec(shop_spec, tmp_path), spec_dir=str(shop_files))
    runs = _runs(store)
    assert [r.info.status for r in runs] == ["FAILED"]
    assert "clear_refs" in runs[0].data.tags["relflow.error"]


def test_a_run_projected_over_run_max_minutes_stops_with_exit_2_and_ends_failed(
    prefect_harness, shop_spec, shop_files, tmp_path, store
):
    """run.max_minutes (issue 41 item 5): the first projection, after the first steady batches,
    is over the limit, so the run stops there with a UserError (exit 2) naming the projection
    and what drives it; its MLflow run is FAILED, never RUNNING, with the projection in
    relflow.error, and no prediction file, checkpoint or temporary is left."""
    import flows.benchmark as flow_module

    spec = _predict_spec(shop_spec, tmp_path)  # 5 root rows: the first call, then 4 steady batches
    spec["run"] = {**spec["run"], "batch_size": 1, "max_minutes": 1e-6}
    with pytest.raises(UserError) as err:
        flow_module.benchmark(spec=spec, spec_dir=str(shop_files))
    assert err.value.exit_code == 2
    msg = str(err.value)
    assert "run.max_minutes is 1e-06" in msg and "projected" in msg and "run.batch_size 1" in msg
    runs = _runs(store)
    assert [r.info.status for r in runs] == ["FAILED"]
    assert "run.max_minutes" in runs[0].data.tags["relflow.error"]
    out = tmp_path / "out"
    assert not out.exists() or not list(out.iterdir())  # no predictions, checkpoint or temporary
