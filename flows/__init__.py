"""Prefect flows and the CLI. Prefect reads its settings at import, so defaults go here."""

import os

# Loopback-only, quiet defaults; an explicit environment setting always wins.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_TASKS_DEFAULT_NO_CACHE", "true")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")
