"""Checks of the places a run writes to, before any work: the MLflow tracking store and
``run.output_dir``.

Without them an unreachable tracking server failed after minutes of MLflow's retries, an
unwritable SQLite path after ~2 minutes, an unwritable output folder only at the write
stage after all training, each with a traceback. Here each is a ``UserError`` (exit 2)
within seconds, naming the URI (credentials masked) or folder and the fix.
"""

from __future__ import annotations

import os
import socket
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tasks.runtime.errors import UserError
from tasks.runtime.masking import mask_uri, scheme_of
from tasks.spec import Spec

PROBE_TIMEOUT_S = 5.0
DB_PORTS = {"postgresql": 5432, "postgres": 5432, "mysql": 3306, "mssql": 1433}


def _fix(masked: str) -> str:
    return (
        f"Start the tracking server or fix MLFLOW_TRACKING_URI (now '{masked}'); unset it "
        "to use ./mlflow.db in the current folder."
    )


def _writable_dir(folder: Path) -> str | None:
    """None if a file can be created in ``folder``, else why not. A missing folder is not
    created (a run that fails its checks leaves nothing behind): its nearest existing parent
    must take a new folder."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"'{probe}' is not a folder"
    try:
        with tempfile.TemporaryDirectory(dir=probe, prefix=".relflow-write-check-"):
            pass
    except OSError as err:
        return err.strerror or str(err)
    return None


def _check_http(uri: str, masked: str) -> None:
    parts = urlsplit(uri)
    # credentials stay out of the probe URL: a reply of any kind (401 included) is enough
    netloc = parts.netloc.rsplit("@", 1)[-1]
    probe = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/health", "", ""))
    try:
        urllib.request.urlopen(probe, timeout=PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return  # the server answered
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise UserError(
            f"The MLflow tracking server {masked} cannot be reached ({reason}), so "
            f"the run could not be recorded. {_fix(masked)}"
        ) from None


def _check_sqlite(uri: str, masked: str) -> None:
    raw = uri.split("://", 1)[1]
    if raw in ("", "/:memory:", ":memory:"):
        return
    db = Path(raw[1:] if raw.startswith("/") else raw)
    if db.exists() and not db.is_file():
        raise UserError(f"The MLflow tracking store {masked} is not a file. {_fix(masked)}")
    if db.exists() and not os.access(db, os.W_OK):
        raise UserError(f"The MLflow tracking store {masked} is not writable. {_fix(masked)}")
    why = _writable_dir(db.parent)
    if why:
        raise UserError(
            f"The MLflow tracking store {masked} cannot be written: its folder "
            f"'{db.parent}' is not writable ({why}). {_fix(masked)}"
        )


def _check_database(uri: str, masked: str, scheme: str) -> None:
    parts = urlsplit(uri)
    host, port = parts.hostname or "127.0.0.1", parts.port or DB_PORTS[scheme]
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as err:
        raise UserError(
            f"The MLflow tracking database {masked} cannot be reached ({err.strerror or err}). {_fix(masked)}"
        ) from None


def check_tracking_store(uri: str) -> None:
    """A ``UserError`` within seconds when the store cannot take a run."""
    masked = mask_uri(uri)
    scheme = scheme_of(uri)
    if scheme in ("http", "https"):
        _check_http(uri, masked)
    elif scheme == "sqlite":
        _check_sqlite(uri, masked)
    elif scheme in DB_PORTS:
        _check_database(uri, masked, scheme)
    elif scheme in ("", "file"):
        why = _writable_dir(Path(urlsplit(uri).path if scheme else uri))
        if why:
            raise UserError(f"The MLflow tracking folder {masked} is not writable ({why}). {_fix(masked)}")


def check_output_dir(output_dir: str) -> None:
    """``run.output_dir`` must take files now, not after all the training."""
    folder = Path(output_dir).resolve()
    why = _writable_dir(folder)
    if why:
        raise UserError(
            f"run.output_dir '{folder}' is not writable ({why}): predictions and "
            "the checkpoint go there. Set run.output_dir to a writable folder "
            "(--set run.output_dir=PATH)."
        )


def check_settings(spec: Spec) -> str:
    """The settings a run needs, checked in a second and before torch, Prefect or MLflow are
    imported (the CLI calls it right after reading the spec): what the model under test
    cannot honour (``model.library``), the tracking URI (no credentials in a server URI, the
    store reachable and writable), ``run.output_dir``, the host lock file. Returns the
    tracking URI."""
    from tasks.libraries import check_library
    from tasks.runtime.hostlock import check_lock_file
    from tasks.tracking.uri import tracking_uri

    check_library(spec)
    uri = tracking_uri()
    check_tracking_store(uri)
    check_output_dir(spec.run.output_dir)
    check_lock_file()
    return uri


def check_before_work(spec: Spec) -> list[str]:
    """Where the run writes and which device it names; then end this host's stale runs.

    Returns notes for the user (stale runs that were ended)."""
    from tasks.run.checks.data import check_device_name
    from tasks.runtime.hostlock import check_lock_file
    from tasks.tracking.stale_runs import end_stale_runs
    from tasks.tracking.uri import tracking_uri

    uri = tracking_uri()
    check_tracking_store(uri)
    stale = end_stale_runs(uri)  # first: any invocation that reaches the store sweeps
    check_output_dir(spec.run.output_dir)
    check_lock_file()
    check_device_name(spec)
    if not stale:
        return []
    return [
        f"marked {len(stale)} RUNNING run(s) of dead processes on this host KILLED "
        f"(tag relflow.found_stale): {', '.join(stale)}"
    ]
