"""The host lock works for every user of the host (tasks/runtime/hostlock.py)."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.repo import REPO


def test_lock_file_is_created_world_writable(tmp_path, monkeypatch):
    from tasks.runtime.hostlock import host_lock

    path = tmp_path / "host.lock"
    monkeypatch.setenv("RELFLOW_LOCK_FILE", str(path))
    old = os.umask(0o022)
    try:
        with host_lock() as waited:
            assert waited < 1.0  # nobody held it
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666


def test_the_wait_is_the_time_another_holder_kept_the_lock(tmp_path, monkeypatch):
    # Before: only "waited >= 0" was checked, true of any clock. Here another open file
    # description holds the flock; host_lock must wait for its release and report that wait,
    # read from a scripted clock: 12.5 s between the attempt and the grant.
    import fcntl
    import threading

    from tasks.runtime import hostlock

    path = tmp_path / "host.lock"
    monkeypatch.setenv("RELFLOW_LOCK_FILE", str(path))
    path.write_text("")
    ticks = iter([100.0, 112.5])
    monkeypatch.setattr(hostlock, "wall_clock", lambda: next(ticks))
    holder = open(path)  # noqa: SIM115 - released by the test below
    fcntl.flock(holder, fcntl.LOCK_EX)
    seen: dict[str, object] = {}
    asked = threading.Event()

    def waiter() -> None:
        with hostlock.host_lock(on_wait=asked.set) as waited:
            seen["waited"] = waited

    t = threading.Thread(target=waiter)
    t.start()
    assert asked.wait(30), "host_lock never reported that it waits"
    assert "waited" not in seen  # still blocked while the holder has it
    fcntl.flock(holder, fcntl.LOCK_UN)
    holder.close()
    t.join(30)
    assert seen["waited"] == 12.5


@pytest.fixture
def shared_tmp():
    """A folder every user can reach (pytest's tmp_path is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="relflow-lock-", dir="/tmp"))
    os.chmod(folder, 0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two users")
def test_another_users_read_only_lock_file_still_locks(shared_tmp):
    """A lock file of user 'daemon' with mode 644: user 'nobody' locks it instead of failing,
    and waits (saying where the lock is) while root holds it."""
    import fcntl

    path = shared_tmp / "shared.lock"
    path.write_text("")
    daemon = pwd.getpwnam("daemon")
    os.chown(path, daemon.pw_uid, daemon.pw_gid)
    os.chmod(path, 0o644)
    nobody = pwd.getpwnam("nobody")
    # Python itself lives under /root here, so the switch to 'nobody' happens after imports.
    code = (
        "import os\nfrom tasks.runtime.hostlock import host_lock, lock_path\n"
        f"os.setgid({nobody.pw_gid})\nos.setuid({nobody.pw_uid})\n"
        "with host_lock(on_wait=lambda: print('waiting for', lock_path(), flush=True)) as w:\n"
        "    print('held after', round(w, 1))\n"
    )

    env = dict(os.environ, RELFLOW_LOCK_FILE=str(path), PYTHONPATH=str(REPO))
    with open(path, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=shared_tmp,
        )
        first = proc.stdout.readline()
        assert first.strip() == f"waiting for {path}", first + proc.stderr.read()
        fcntl.flock(held, fcntl.LOCK_UN)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "held after" in out and "PermissionError" not in err


@pytest.mark.parametrize(
    ("where", "says"),
    [
        ("folder", "is a folder, not a file"),
        ("under-a-file", "is not a folder"),
        ("proc", "no file can be created in '/proc'"),  # os.access says yes to root there
    ],
)
def test_a_lock_file_that_cannot_be_used_is_refused_up_front(where, says, tmp_path, monkeypatch):
    from tasks.runtime.errors import UserError
    from tasks.runtime.hostlock import check_lock_file

    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("x")
    path = {"folder": tmp_path / "folder", "under-a-file": tmp_path / "file" / "host.lock"}.get(
        where, Path("/proc/relflow-bench-test.lock")
    )
    monkeypatch.setenv("RELFLOW_LOCK_FILE", str(path))
    with pytest.raises(UserError) as err:
        check_lock_file()
    msg = str(err.value)
    assert f"'{path}' (RELFLOW_LOCK_FILE)" in msg and says in msg and "set RELFLOW_LOCK_FILE to" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder"]  # no probe left behind


def test_a_lock_file_in_a_missing_folder_passes_and_nothing_is_left_behind(tmp_path, monkeypatch):
    from tasks.runtime.hostlock import check_lock_file

    monkeypatch.setenv("RELFLOW_LOCK_FILE", str(tmp_path / "new" / "host.lock"))
    check_lock_file()  # host_lock creates the folder and the file when it first locks
    assert list(tmp_path.iterdir()) == []
