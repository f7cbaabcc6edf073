"""Up-front checks of where a run writes (tasks/run/checks/preflight.py): each fails in seconds, names
the URI (credentials masked) or folder and the fix."""

from __future__ import annotations

import socket
import time

import pytest

from tasks.run.checks.preflight import check_output_dir, check_tracking_store, mask_uri
from tasks.runtime.errors import UserError


def test_mask_uri_hides_credentials_and_secret_query_values():
    assert mask_uri("http://alice:s3cret@host:5000/x") == "http://***@host:5000/x"
    assert (
        mask_uri("postgresql+psycopg://u:p@db/mlflow?sslmode=require&password=p")
        == "postgresql+psycopg://u:***@db/mlflow?sslmode=require&password=***"
    )
    assert mask_uri("sqlite:////tmp/a.db") == "sqlite:////tmp/a.db"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_is_named_masked_within_seconds():
    port = _closed_port()
    start = time.monotonic()
    with pytest.raises(UserError) as err:
        check_tracking_store(f"http://alice:s3cret@127.0.0.1:{port}")
    msg = str(err.value)
    assert f"http://***@127.0.0.1:{port}" in msg and "s3cret" not in msg and "alice" not in msg
    assert "MLFLOW_TRACKING_URI" in msg
    assert time.monotonic() - start < 30  # not MLflow's minutes of retries


def test_a_server_that_answers_passes():
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from threading import Thread

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(401)  # an auth-protected server still answers
            self.end_headers()

        def log_message(self, *a):
            pass

    server = HTTPServer(("127.0.0.1", 0), Health)
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        check_tracking_store(f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()


def test_unwritable_sqlite_path_and_unreachable_database():
    with pytest.raises(UserError, match=r"sqlite:////proc/relflow/mlflow.db cannot be written"):
        check_tracking_store("sqlite:////proc/relflow/mlflow.db")
    with pytest.raises(UserError, match=r"postgresql://u:\*\*\*@127.0.0.1:\d+/m cannot be reached"):
        check_tracking_store(f"postgresql://u:pw@127.0.0.1:{_closed_port()}/m")


def test_writable_sqlite_path_passes(tmp_path):
    check_tracking_store(f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}")


def test_unwritable_output_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UserError, match=r"run.output_dir '.*file/out' is not writable"):
        check_output_dir(str(blocker / "out"))
    check_output_dir(str(tmp_path / "outputs"))
    assert sorted(tmp_path.iterdir()) == [blocker]  # nothing created: no folder, no probe left
