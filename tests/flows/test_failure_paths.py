"""A failing run ends FAILED in MLflow whatever its cleanup does (issue 24).

The prediction writer used to be aborted before the run was ended: an abort that raised (a
full disk) left the run RUNNING. Here the real flow runs with a writer that fails like a
full disk, on its writes and on its abort: the run must end FAILED with the write's error,
which names the file and the fix (not an unnamed ``OSError`` in Prefect's traceback).
"""

from __future__ import annotations

import errno

import pytest
from mlflow.tracking import MlflowClient

from tasks.runtime.errors import UserError

pytestmark = pytest.mark.slow  # real flow runs under the session's Prefect server


def test_failing_run_is_ended_failed_even_when_the_writer_abort_raises(
    prefect_harness, shop_spec, shop_files, tmp_path, monkeypatch
):
    import flows.benchmark as flow_module
    from tasks.stages.write import PredictionWriter

    class FullDisk(PredictionWriter):
        def write(self, table):
            raise OSError(errno.ENOSPC, "No space left on device")

        def abort(self):
            super().abort()
            raise OSError(errno.ENOSPC, "No space left on device")

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(flow_module, "PredictionWriter", FullDisk)
    spec = {**shop_spec, "run": {**shop_spec.get("run", {}), "mode": "predict", "output_dir": str(tmp_path / "out")}}
    with pytest.raises(UserError) as err:
        flow_module.benchmark(spec=spec, spec_dir=str(shop_files))
    msg = str(err.value)
    assert "Writing predictions to '" in msg and str(tmp_path / "out") in msg and "No space left on device" in msg
    assert "run.output_dir" in msg
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.status for r in runs] == ["FAILED"]
    assert "No space left on device" in runs[0].data.tags["relflow.error"]
    assert not list((tmp_path / "out").glob("*.parquet"))
