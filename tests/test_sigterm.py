"""tests/sigterm.py: a SIGTERM to pytest still runs the fixtures' teardowns, so a server a
fixture started in its own session (as tests/pgserver.py starts every server) is stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie of an exited child counts as gone
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def _session(tmp_path: Path, install: bool) -> int:
    """Run a pytest session whose fixture starts a 'server' (sleep, own session), SIGTERM the
    session while its test runs, and return the server's pid."""
    pid_file = tmp_path / "server.pid"
    (tmp_path / "conftest.py").write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(ROOT)!r})
            from tests.sigterm import stop_on_sigterm

            def pytest_configure(config):
                if {install!r}:
                    stop_on_sigterm()
            """
        )
    )
    (tmp_path / "test_server.py").write_text(
        textwrap.dedent(
            f"""
            import subprocess, time, pytest

            @pytest.fixture
            def server():
                proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
                open({str(pid_file)!r}, "w").write(str(proc.pid))
                try:
                    yield proc
                finally:
                    proc.terminate()
                    proc.wait()

            def test_waits(server):
                time.sleep(120)
            """
        )
    )
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and session.poll() is None, "the session never started its server"
        time.sleep(0.1)
    server = int(pid_file.read_text())
    session.send_signal(signal.SIGTERM)
    session.wait(timeout=60)
    return server


def test_a_sigterm_still_stops_the_servers_fixtures_started(tmp_path):
    server = _session(tmp_path, install=True)
    deadline = time.monotonic() + 10
    while _alive(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(server)


def test_without_the_handler_the_server_outlives_the_session(tmp_path):
    """The control: pytest's default SIGTERM death leaves it running (what the handler fixes)."""
    server = _session(tmp_path, install=False)
    try:
        time.sleep(1.0)
        assert _alive(server)
    finally:
        os.kill(server, signal.SIGKILL)
