"""Real servers for tests: a throwaway PostgreSQL cluster and an ``mlflow server`` on loopback.

``running_postgres(folder)`` runs Debian's PostgreSQL binaries (``/usr/lib/postgresql/<v>/bin``)
on a temp data directory and a free 127.0.0.1 port. ``initdb`` and ``postgres`` refuse to run
as root, so as root they run as the ``postgres`` system user (``runuser -u postgres --``);
the data directory is made for that user. Authentication is ``trust`` on loopback only (the
cluster lives for one test session), or, with ``password=``, scram password authentication,
so tests exercise credentials from the environment (the session fixture ``postgres_server``
in ``conftest.py`` does that with ``PASSWORD``). Without PostgreSQL installed the test skips,
except under CI (``CI`` set), where it fails. ``create_database(pg, name)`` adds a database.

``running_mlflow_server(backend_uri, folder, ...)`` starts ``mlflow server`` with proxied
artifacts (``--serve-artifacts``) on a free loopback port and waits for ``/health``.

``private_dir(prefix)`` is a temp folder of their own: pytest's ``tmp_path`` lives under a
``pytest-of-<user>`` tree that other pytest sessions on the host prune while long tests still
run (PostgreSQL aborts when its data directory vanishes), so servers keep their files here.

All stop their processes by pid (process group) on exit, also when the test fails. Import
from tests as ``from pgserver import ...`` (``tests/`` is on ``sys.path`` through its conftest).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

# The session server's password (``postgres_server``): tests check that it never reaches MLflow.
PASSWORD = "relflow-test-secret-7Qx"


@contextmanager
def private_dir(prefix: str = "relflow-test-") -> Iterator[Path]:
    """A temp folder outside pytest's shared basetemp, removed on exit."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def postgres_bin() -> Path | None:
    """The newest Debian PostgreSQL ``bin`` folder, or None when PostgreSQL is not installed."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/postgres"),
        key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0,
    )
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("postgres")
    return Path(on_path).parent if on_path else None


@dataclass(frozen=True)
class PgServer:
    host: str
    port: int
    user: str
    bin_dir: Path
    password: str | None = None  # None: trust authentication

    def url(self, database: str = "postgres", driver: str = "postgresql+psycopg") -> str:
        """SQLAlchemy URL (``postgresql+psycopg://``, psycopg 3) of one database; no password."""
        return f"{driver}://{self.user}@{self.host}:{self.port}/{database}"

    @property
    def dsn(self) -> str:
        """libpq URL of the ``postgres`` database, as a spec's ``source.database.url`` spells
        it; no password (it comes from PGPASSWORD)."""
        return self.url(driver="postgresql")


def require_postgres() -> Path:
    """The PostgreSQL ``bin`` folder; the test skips without one, or fails under CI."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        why = "PostgreSQL is not installed (Debian: apt-get install -y postgresql)"
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI must run the PostgreSQL tests")
        pytest.skip(why)
    return bin_dir


def _as_db_user(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


def _stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        except ProcessLookupError:
            pass


@contextmanager
def running_postgres(folder: Path, password: str | None = None) -> Iterator[PgServer]:
    """A fresh PostgreSQL cluster in ``folder`` on a free loopback port (scram authentication
    with ``password``, else trust); skips if not installed (fails under CI)."""
    bin_dir = require_postgres()
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "pgdata"
    data.mkdir()
    user = "postgres" if os.geteuid() == 0 else os.environ.get("USER", "postgres")
    if os.geteuid() == 0:
        # runuser drops to 'postgres': it must be able to reach and own the data directory.
        shutil.chown(data, "postgres", "postgres")
        for parent in [folder, *folder.parents]:
            if str(parent) in ("/", "/tmp"):
                break
            os.chmod(parent, os.stat(parent).st_mode | 0o711)
    auth = ["-A", "trust"]
    if password is not None:
        pwfile = folder / "pw"
        pwfile.write_text(password + "\n")
        if os.geteuid() == 0:
            shutil.chown(pwfile, "postgres", "postgres")
        auth = ["--auth=scram-sha-256", f"--pwfile={pwfile}"]
    subprocess.run(
        _as_db_user([str(bin_dir / "initdb"), "-D", str(data), "-U", user, *auth, "--no-sync", "-E", "UTF8"]),
        check=True,
        capture_output=True,
        timeout=120,
    )
    port = free_port()
    log = folder / "postgres.log"
    with open(log, "w") as fh:
        if os.geteuid() == 0:
            shutil.chown(log, "postgres", "postgres")
        proc = subprocess.Popen(
            _as_db_user(
                [
                    str(bin_dir / "postgres"),
                    "-D",
                    str(data),
                    "-p",
                    str(port),
                    "-h",
                    "127.0.0.1",
                    "-k",
                    str(data),
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=200",
                ]
            ),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            ready = subprocess.run(
                [str(bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)], capture_output=True
            )
            if ready.returncode == 0:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)
        yield PgServer("127.0.0.1", port, user, bin_dir, password)
    finally:
        _stop(proc, signal.SIGINT)  # SIGINT = PostgreSQL's "fast" shutdown


def create_database(pg: PgServer, name: str) -> str:
    """Create database ``name``; returns its SQLAlchemy URL."""
    import psycopg

    with psycopg.connect(
        host=pg.host, port=pg.port, user=pg.user, password=pg.password, dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return pg.url(name)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


@contextmanager
def running_mlflow_server(
    backend_uri: str, folder: Path, *, app_name: str | None = None, env: dict[str, str] | None = None, workers: int = 2
) -> Iterator[str]:
    """``mlflow server`` on 127.0.0.1:<free port> with proxied artifacts in ``folder``; yields its URL."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--backend-store-uri",
        backend_uri,
        "--serve-artifacts",
        "--artifacts-destination",
        (folder / "artifacts").as_uri(),
        "--workers",
        str(workers),
    ]
    if app_name:
        args += ["--app-name", app_name]
    server_env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", **(env or {}))
    server_env.pop("MLFLOW_TRACKING_URI", None)
    log = folder / f"mlflow-server-{port}.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            args, env=server_env, cwd=folder, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 240
        while not healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not start:\n{log.read_text()[-4000:]}")
            time.sleep(0.5)
        yield url
    finally:
        _stop(proc)


@contextmanager
def running_prefect_server(folder: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """``prefect server start`` on 127.0.0.1:<free port> (own PREFECT_HOME); yields its API URL."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    server_env = dict(
        os.environ, PREFECT_HOME=str(folder / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false", **(env or {})
    )
    server_env.pop("PREFECT_API_URL", None)
    log = folder / f"prefect-server-{port}.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            ["prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui"],
            env=server_env,
            cwd=folder,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 600  # minutes on a busy shared host
        while not healthy(api):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prefect server did not start:\n{log.read_text()[-4000:]}")
            time.sleep(1.0)
        yield api
    finally:
        _stop(proc)
