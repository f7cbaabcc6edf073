"""Database bad input through the real CLI: exit 2 before Prefect or MLflow start, the URL
shown with its password masked, and the fix named.

Named ``test_app_database_errors.py`` (tests/README.md): test_app.py holds the app's own tests; this
file is one aspect of ``run``/``data`` (flows/cli/app.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.repo import REPO

pytestmark = pytest.mark.slow  # real CLI processes against database URLs


def _cli(folder: Path, *sets: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update(
        {
            "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}",
            "PREFECT_HOME": str(folder / "prefect-home"),
            "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            **(env_extra or {}),
        }
    )
    env.pop("PREFECT_API_URL", None)
    args = [a for s in sets for a in ("--set", s)]
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_password_in_url_and_unreachable_server_exit_2_masked(tmp_path):
    port = _free_port()
    spelled = _cli(tmp_path, f"source.database.url=postgresql://bob:hunter2@127.0.0.1:{port}/db")
    assert spelled.returncode == 2, spelled.stderr
    text = spelled.stdout + spelled.stderr
    assert "hunter2" not in text and "bob:***@" in text and "PGPASSWORD" in text

    down = _cli(
        tmp_path, f"source.database.url=postgresql://bob@127.0.0.1:{port}/db", env_extra={"PGPASSWORD": "env-secret-99"}
    )
    assert down.returncode == 2, down.stderr
    text = " ".join((down.stdout + down.stderr).split())  # Rich wraps long lines
    assert "env-secret-99" not in text
    assert f"Cannot connect to database postgresql://bob@127.0.0.1:{port}/db" in text
    assert "Check that the server is running" in text
    assert "Traceback" not in text
    assert not (tmp_path / "mlflow.db").exists()  # failed before any MLflow run
