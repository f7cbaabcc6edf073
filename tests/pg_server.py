"""A throwaway PostgreSQL server for tests: initdb + postgres on 127.0.0.1 at a free port.

Debian's ``postgresql`` package (installed by the project's set-up) puts the binaries under
``/usr/lib/postgresql/<version>/bin``. ``initdb`` and ``postgres`` refuse to run as root, so
as root they run as the ``postgres`` system user (``runuser``) on a temp data folder that
user owns. Password authentication (scram) is on, so tests exercise credentials from the
environment. ``pg_binaries`` returns None when no server is installed: tests skip then,
except under CI, where a missing server is a failure.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PASSWORD = "relflow-test-secret-7Qx"
USER = "relflow"


def pg_binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    exe = shutil.which("initdb")
    return Path(exe).parent if exe else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PgServer:
    port: int
    folder: Path
    process: subprocess.Popen

    @property
    def url(self) -> str:  # no password: it comes from PGPASSWORD
        return f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        self.process.terminate()  # SIGTERM = smart shutdown; connections are closed by then
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def start(bin_dir: Path) -> PgServer:
    folder = Path(tempfile.mkdtemp(prefix="relflow-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    pwfile = folder / "pw"
    pwfile.write_text(PASSWORD + "\n")
    if as_user:
        shutil.chown(pwfile, "postgres")
    data = folder / "data"
    subprocess.run(
        [
            *as_user,
            str(bin_dir / "initdb"),
            "-D",
            str(data),
            "-U",
            USER,
            "--auth=scram-sha-256",
            f"--pwfile={pwfile}",
            "--no-sync",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    port = _free_port()
    proc = subprocess.Popen(
        [
            *as_user,
            str(bin_dir / "postgres"),
            "-D",
            str(data),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-k",
            str(folder),
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(folder / "log", "w"),  # noqa: SIM115
    )
    server = PgServer(port, folder, proc)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"postgres exited: {(folder / 'log').read_text()[-2000:]}")
        ok = subprocess.run([str(bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)], capture_output=True)
        if ok.returncode == 0:
            return server
        time.sleep(0.2)
    server.stop()
    raise RuntimeError("postgres did not become ready in 60 s")
