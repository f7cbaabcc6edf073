"""Every CLI message and link shows URIs masked (tasks/runtime/masking.py, issue 24), and a
piped result table is printed whole.

In-process and before Prefect or MLflow start: the run's settings checks refuse or fail on
a tracking URI with secrets in it, and the CLI's error ending masks whatever a library's
error quotes. (A whole run grepped for a secret: test_app_secrets_and_orphans.py.)
"""

from __future__ import annotations

import io
import socket
import sys

import pytest
import typer
import yaml
from rich.table import Table
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


def _keys_table() -> Table:
    table = Table(title="compare")
    for col in ("metric", "baseline", "candidate", "ratio", "mde", "test", "verdict"):
        table.add_column(col)
    for key in ("compute.steady_rows_per_s", "latency.step_ms.tensorize.mean", "stage.retrieve.predict.seconds"):
        table.add_row(key, "12,345.678", "23,456.789", "1.900x", "12.3%", "exact p=0.002 holm=0.031", "improvement")
    return table


@pytest.mark.parametrize("columns_at_import", ["40", None])
def test_a_piped_table_is_printed_whole_at_its_own_width(columns_at_import, monkeypatch):
    # The defect: a table piped at 80 columns (or whatever COLUMNS said when the CLI was
    # imported) wrapped its metric keys across lines, so `compare A B | grep KEY` missed them.
    from rich.console import Console

    from flows.cli import common

    if columns_at_import is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns_at_import)
    monkeypatch.setattr(common, "out", Console(soft_wrap=True))  # built now, under that COLUMNS
    monkeypatch.setenv("COLUMNS", "30")  # and a narrow one at print time
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stdout", buf)
    assert not common.out.is_terminal
    common.show_table(_keys_table())
    text = buf.getvalue()
    for key in ("compute.steady_rows_per_s", "latency.step_ms.tensorize.mean", "stage.retrieve.predict.seconds"):
        line = next(row for row in text.splitlines() if key in row)  # one line holds the whole row
        assert "23,456.789" in line and "improvement" in line, text
    widths = {len(row) for row in text.splitlines()[1:] if row.strip()}
    assert max(widths) > 80, text  # wider than a pipe's default: nothing was squeezed
