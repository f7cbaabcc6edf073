"""A CSV that does not parse, through the real CLI: exit 2 before Prefect or MLflow start,
naming the table, file, column, offending value and the ``source.csv`` key that fixes it.

The workload is the kind users bring: ``;``-separated, R-style ``NA`` markers (read as nulls
by default), and one ``?`` marker the defaults do not know. The fixed spec (``?`` added to
``source.csv.null_values``) then runs end to end (slow: Prefect's temporary server).

Named ``test_app_csv.py`` (tests/README.md): test_app.py holds the app's own tests; this file is one
aspect of ``run``/``data`` (flows/cli/app.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tasks.spec import PANDAS_NULL_VALUES
from tests.repo import REPO

pytestmark = pytest.mark.slow  # real CLI processes


PEOPLE = "id;balance;since;churn\n" + "".join(
    f"{i};{'NA' if i % 4 == 0 else '?' if i == 7 else i * 1.5};"
    f"{'NA' if i % 5 == 0 else f'2024-01-{1 + i % 28:02d}'};{'yes' if i % 3 else 'no'}\n"
    for i in range(1, 41)
)
VISITS = "person;amount;note\n" + "".join(
    f'{1 + i % 40};{"N/A" if i % 6 == 0 else i};"line one\nline two"\n' for i in range(120)
)


def _spec(null_values: list[str] | None = None) -> dict:
    csv: dict = {"separator": ";"}
    if null_values is not None:
        csv["null_values"] = null_values
    return {
        "name": "messy",
        "source": {"tables": {"people": "people.csv", "visits": "visits.csv"}, "csv": csv},
        "schema": {
            "root": {"table": "people", "key": "id", "columns": {"balance": "numeric", "since": "timestamp"}},
            "branches": [
                {
                    "name": "visits",
                    "table": "visits",
                    "parent_key": "person",
                    "max_length": 4,
                    "columns": {"amount": "numeric", "note": "category"},
                }
            ],
        },
        "task": {"target": "churn", "kind": "category"},
        "model": {"d_model": 8, "layers": 1, "heads": 2},
        "run": {
            "batch_size": 8,
            "epochs": 1,
            "warmup_batches": 0,
            "device": "cpu",
            "min_steady_batches": 1,
            "min_steady_seconds": 0.000001,
            "system_metrics_interval_s": 0,
        },
    }


def _run(folder: Path, spec: dict) -> subprocess.CompletedProcess:
    (folder / "data").mkdir(exist_ok=True)
    (folder / "data" / "people.csv").write_text(PEOPLE)
    (folder / "data" / "visits.csv").write_text(VISITS)
    path = folder / "data" / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    env = dict(
        os.environ,
        MLFLOW_TRACKING_URI=f"sqlite:///{folder / 'mlflow.db'}",
        PREFECT_HOME=str(folder / "prefect-home"),
        COLUMNS="200",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="600",
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    env.pop("PREFECT_API_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", str(path), "--json", str(folder / "summary.json")],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_unparsed_marker_exits_2_before_prefect_and_mlflow(tmp_path):
    r = _run(tmp_path, _spec())
    assert r.returncode == 2, r.stderr[-3000:]
    msg = " ".join(r.stderr[r.stderr.rfind("error:") :].split())
    for part in ("Column 'balance'", "table 'people'", "people.csv", "'?'", "data row 7", "source.csv.null_values"):
        assert part in msg, (part, msg)
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "mlflow.db").exists()  # MLflow never started
    assert not list(tmp_path.rglob("prefect.db"))  # nor Prefect's server


@pytest.mark.slow
def test_the_named_fix_runs_end_to_end(tmp_path):
    r = _run(tmp_path, _spec([*PANDAS_NULL_VALUES, "?"]))
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    m = summary["metrics"]
    assert m["data.rows_predicted"] == 40
    # every visit row of the 40 people fits max_length 4 (3 each): 40 root + 120 visit rows
    assert m["data.coords_present"] == 40 * 3 + 120 * 2
