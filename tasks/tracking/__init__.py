"""The run's MLflow record: the one package that imports MLflow (an import-linter contract).

MLflow's telemetry is off before any module here imports MLflow."""

import os

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
