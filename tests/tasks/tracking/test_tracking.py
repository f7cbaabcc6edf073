"""The MLflow module against a temp SQLite store: a run always ends, errors are recorded."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tasks.runtime.errors import UserError
from tasks.tracking.adapters import mlflow_name
from tasks.tracking.uri import tracking_uri
from tasks.tracking.writer import Tracker, flatten


def test_default_store_is_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert tracking_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_flatten_names_branches_by_name(shop_spec):
    params = flatten(shop_spec)
    assert params["schema.branches.orders.max_length"] == "2"
    assert params["schema.branches.orders.branches.lines.order_by.column"] == "l_no"
    assert params["schema.root.columns.c_since"] == "timestamp"
    assert params["run.batch_size"] == "4"


def test_names_from_the_users_data_become_keys_mlflow_accepts_and_stay_apart(mlflow_uri):
    """A column or branch name MLflow refuses in a key ('Amount ($)', 'a//b') fails no run: its
    key is the name with '_' for each refused character plus a hash of the original, so two
    names differing only there stay two keys; a key MLflow accepts is left exactly as it is."""
    assert mlflow_name("schema.root.columns.é ok: x/y-z_1") == "schema.root.columns.é ok: x/y-z_1"
    dollar, percent = mlflow_name("c.Amount ($)"), mlflow_name("c.Amount (%)")
    assert dollar.startswith("c.Amount ___:") and percent.startswith("c.Amount ___:") and dollar != percent
    assert mlflow_name("data.orphan_rows.a//b").startswith("data.orphan_rows.a__b:")
    tracker = Tracker("unit")
    run_id = tracker.start("r", tags={})
    tracker.log_params(flatten({"schema": {"root": {"columns": {"Amount ($)": "numeric", "Amount (%)": "numeric"}}}}))
    tracker.log_metrics({"data.orphan_rows.a//b": 3.0, "data.orphan_rows.items": 1.0})
    tracker.set_tags({"relflow.note[x]": "y"})
    tracker.finish()
    run = MlflowClient(tracking_uri=mlflow_uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert set(run.data.params) == {
        mlflow_name("schema.root.columns.Amount ($)"),
        mlflow_name("schema.root.columns.Amount (%)"),
    }
    assert run.data.metrics == {mlflow_name("data.orphan_rows.a//b"): 3.0, "data.orphan_rows.items": 1.0}
    assert run.data.tags[mlflow_name("relflow.note[x]")] == "y"


@pytest.mark.slow
def test_a_run_finishes_with_batched_metrics_params_and_tags(mlflow_uri):
    tracker = Tracker("unit")
    run_id = tracker.start("r", tags={"relflow.spec_hash": "abc"})
    tracker.log_params({f"p{i}": i for i in range(250)})  # more than one batch
    tracker.log_metrics({f"m.{i}": float(i) for i in range(1500)})
    tracker.set_tags({"relflow.validity": "VALID"})
    tracker.log_text("name: x\n", "spec.yaml")
    tracker.finish()
    run = MlflowClient(tracking_uri=mlflow_uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert len(run.data.params) == 250 and len(run.data.metrics) == 1500
    assert run.data.tags["relflow.spec_hash"] == "abc"
    assert "spec.yaml" in {a.path for a in MlflowClient(tracking_uri=mlflow_uri).list_artifacts(run_id)}
    # the experiment is reused, artifacts beside the store
    again = Tracker("unit")
    assert again.experiment_id == tracker.experiment_id
    exp = MlflowClient(tracking_uri=mlflow_uri).get_experiment(tracker.experiment_id)
    assert exp.artifact_location == (Path(mlflow_uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()


@pytest.mark.slow
def test_a_failed_run_ends_with_the_error_recorded(mlflow_uri):
    client = MlflowClient(tracking_uri=mlflow_uri)
    Tracker("unit").fail(RuntimeError("never started"))  # before start: a no-op
    assert client.search_runs([client.get_experiment_by_name("unit").experiment_id]) == []
    for error, status in [
        (UserError("bad key 7"), "FAILED"),
        (KeyboardInterrupt(), "KILLED"),
        (SystemExit(143), "KILLED"),
    ]:
        tracker = Tracker("unit")
        run_id = tracker.start("r", tags={})
        tracker.fail(error)
        run = client.get_run(run_id)
        assert run.info.status == status
        assert run.data.tags["relflow.error"].startswith(type(error).__name__)
    assert (
        "bad key 7"
        in client.search_runs([tracker.experiment_id], "attributes.status = 'FAILED'")[0].data.tags["relflow.error"]
    )
    # A URI with its secret (a free-form spec value, a library's error) is stored masked: params,
    # tags, the error tag and the traceback.
    tracker = Tracker("unit")
    run_id = tracker.start("r", tags={})
    tracker.log_params({"run.compile.options.cache": "https://u:s3cretQ@cache.example/x", "run.batch_size": 4})
    tracker.set_tags({"relflow.note": "from HTTP://h/?token=s3cretQ"})
    tracker.fail(ConnectionError("postgresql://bob:s3cretQ@db/mlflow?sslpassword=s3cretQ refused"))
    data = client.get_run(run_id).data
    assert data.params == {"run.compile.options.cache": "https://***@cache.example/x", "run.batch_size": "4"}
    assert data.tags["relflow.note"] == "from HTTP://h/?token=***"
    tag = data.tags["relflow.error"]
    error_txt = Path(
        client.download_artifacts(run_id, "error.txt", str(Path(mlflow_uri.removeprefix("sqlite:///")).parent))
    ).read_text()
    assert "s3cretQ" not in tag + error_txt
    assert "postgresql://bob:***@db/mlflow?sslpassword=*** refused" in tag and "ConnectionError" in error_txt


def test_system_metrics_touch_no_store_until_flushed(mlflow_uri, monkeypatch):
    """Sampling runs inside the timed region: it may not read or write the store there."""
    import threading

    calls: list[str] = []
    for name in ("log_batch", "get_run", "log_metric"):
        original = getattr(MlflowClient, name)

        def spy(self, *a, _name=name, _original=original, **kw):
            calls.append(_name)
            return _original(self, *a, **kw)

        monkeypatch.setattr(MlflowClient, name, spy)
    tracker = Tracker("unit")
    run_id = tracker.start("r", tags={})
    calls.clear()
    tracker.start_system_metrics(0.02)
    threading.Event().wait(0.3)  # the "timed region"
    tracker.stop_system_metrics()
    assert calls == []
    tracker.flush_system_metrics()
    tracker.finish()
    history = MlflowClient(tracking_uri=mlflow_uri).get_metric_history(run_id, "system/cpu_utilization_percentage")
    assert len(history) >= 3
    assert [m.step for m in history] == sorted(m.step for m in history)
