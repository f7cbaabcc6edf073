"""Which MLflow store a run writes to, decided without importing MLflow (the CLI's up-front
checks run before any heavy import).

``MLFLOW_TRACKING_URI`` or ``sqlite:///<cwd>/mlflow.db``. A tracking *server* URI with
credentials in it (``user:password@host``, in any letter case of the scheme) is refused:
the URI is printed, logged and stored in deployments, and the client would send them on.
Shown anywhere, a URI goes through ``tasks.runtime.masking.mask_uri``.
"""

from __future__ import annotations

import os
from pathlib import Path

from tasks.runtime.errors import UserError
from tasks.runtime.masking import has_userinfo, mask_uri, scheme_of


def tracking_uri() -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"
    if is_server(uri) and has_userinfo(uri):
        raise UserError(
            f"MLFLOW_TRACKING_URI carries credentials (user:password@host: {mask_uri(uri)}); remove "
            "them and set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD instead."
        )
    return uri


def is_server(uri: str) -> bool:
    """A tracking server (``mlflow server``) rather than a store this process opens itself."""
    return scheme_of(uri) in ("http", "https")


def default_artifact_root(uri: str) -> str | None:
    """Artifacts beside a local SQLite store; a server or other store decides for itself."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    return None
