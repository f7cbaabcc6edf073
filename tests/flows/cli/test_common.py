"""Every CLI message and link shows URIs masked (tasks/runtime/masking.py, issue 24).

In-process and before Prefect or MLflow start: the run's settings checks refuse or fail on
a tracking URI with secrets in it, and the CLI's error ending masks whatever a library's
error quotes. (A whole run grepped for a secret: test_app_secrets_and_orphans.py.)
"""

from __future__ import annotations

import socket

import pytest
import typer
import yaml
from typer.testing import CliRunner

from tasks.runtime.errors import UserError

SECRET = "s3cretW9"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        (
            f"HTTPS://alice:{SECRET}@127.0.0.1:{{port}}/",
            "carries credentials (user:password@host: HTTPS://***@127.0.0.1:",
        ),
        (f"Http://127.0.0.1:{{port}}/?api_key={SECRET}", "?api_key=***"),  # refused: cannot be reached
        (f"PostgreSQL+psycopg://bench:{SECRET}@127.0.0.1:{{port}}/mlflow", "PostgreSQL+psycopg://bench:***@127.0.0.1:"),
    ],
)
def test_run_refuses_a_tracking_uri_without_printing_its_secret(uri, shown, tmp_path, monkeypatch, shop_spec):
    from flows.cli.app import app

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(shop_spec))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri.format(port=_closed_port()))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["run", str(spec)])
    text = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert result.exit_code == 2, text
    assert SECRET not in text and shown in text and "MLFLOW_TRACKING_URI" in text


@pytest.mark.parametrize("error", [UserError, ConnectionError])
def test_the_cli_error_ending_masks_what_a_library_quotes(error):
    from flows.cli.common import console, fail

    with console.capture() as captured, pytest.raises(typer.Exit) as ended:
        fail(error(f"refused by http://h:1/api?token={SECRET} and postgresql://bob:{SECRET}@db/x"), debug=False)
    text = captured.get()
    assert ended.value.exit_code == (2 if error is UserError else 1)
    assert SECRET not in text and "token=***" in text and "postgresql://bob:***@db/x" in text


def test_the_prefect_artifact_links_a_tracking_server_in_any_scheme_case():
    from flows.artifacts import run_url

    summary = {"tracking_uri": "HTTPS://mlflow.example:5000/", "experiment_id": "3", "run_id": "abc"}
    assert run_url(summary) == "HTTPS://mlflow.example:5000/#/experiments/3/runs/abc"
    assert run_url({**summary, "tracking_uri": "sqlite:////tmp/mlflow.db"}) is None
