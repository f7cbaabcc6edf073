"""``relflow-bench budget`` (flows/cli/budget.py): a bad grid exits 2 before any child runs; a real
budget of two context sizes on a small RelBench folder makes one parent run with a child per
point, with the right params, the budget figures, the front and the table, chart and PNG."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.repo import REPO
from tests.tasks.relbench_folders import social, spec_file

TIMEOUT_S = 1500
TINY = (
    "model: {d_model: 16, layers: 1, heads: 2}\n"
    "run: {epochs: 1, batch_size: 64, min_steady_batches: 1, min_steady_seconds: 0.001, "
    "system_metrics_interval_s: 0, max_host_load: null}\n"
)


def _budget(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{cwd / 'mlflow.db'}",
        "COLUMNS": "250",
        "RELFLOW_DATA_DIR": str(cwd / "data"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "600",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", "budget", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return social(tmp_path_factory.mktemp("relbench") / "social", users=40, posts=600)


@pytest.mark.slow  # each a CLI process reading a RelBench folder: 8-17 s on a loaded host
@pytest.mark.parametrize(
    ("grid", "says"),
    [
        (["--grid", "run.batch_size=64,256"], "not context sizes"),
        (["--grid", "posts.max_length=4"], "at least two context sizes"),
        (["--grid", "posts.max_length=4,0"], "max_length"),  # a value the spec refuses
        (["--grid", "nosuch.max_length=4,8"], "nosuch"),
        (["--grid", "posts.overflow=keep_first,keep_most"], "overflow"),
    ],
)
def test_a_bad_grid_exits_2_before_any_child_runs(folder, tmp_path, grid, says):
    spec = spec_file(tmp_path, folder, "user-posts", extra=TINY)
    got = _budget([str(spec), *grid], tmp_path)
    assert got.returncode == 2, got.stderr[-2000:]
    assert says in " ".join(got.stderr.split())
    assert not (tmp_path / "mlflow.db").exists()  # no parent run, no child


@pytest.mark.slow
def test_budget_end_to_end_parent_children_params_front_and_files(folder, tmp_path):
    from mlflow.tracking import MlflowClient

    spec = spec_file(tmp_path, folder, "user-posts", name="rb-budget", extra=TINY)
    out = tmp_path / "report"
    got = _budget([str(spec), "--grid", "posts.max_length=2,8", "--out", str(out)], tmp_path)
    print(got.stdout[-6000:], got.stderr[-3000:])
    assert got.returncode == 0, got.stderr[-4000:]
    parent_id = re.search(r"parent run ([0-9a-f]{32})", " ".join(got.stdout.split()))[1]

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED" and parent.info.run_name == "rb-budget-budget"
    assert parent.data.tags["relflow.report"] == "budget"
    assert parent.data.tags["relflow.budget.quality"] == "relbench.roc_auc"
    assert json.loads(parent.data.params["sweep.grid.posts.max_length"]) == [2, 8]
    assert parent.data.metrics["budget.points"] == 2
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.\"mlflow.parentRunId\" = '{parent_id}'"
    )
    assert len(children) == 2 and {c.info.status for c in children} == {"FINISHED"}
    by_length = {c.data.params["schema.branches.posts.max_length"]: c for c in children}
    assert set(by_length) == {"2", "8"}
    for length, c in by_length.items():
        assert c.data.tags["relflow.sweep.posts.max_length"] == length
        assert c.data.tags["relflow.report"] == "budget"
        m = c.data.metrics
        assert m["budget.ms_per_prediction"] == pytest.approx(
            1000 * m["e2e.predict.seconds"] / m["e2e.predict.rows"], rel=1e-9
        )
        assert m["budget.cells_present_per_prediction"] == pytest.approx(
            m["data.coords_present"] / m["data.rows_predicted"], rel=1e-9
        )
        assert c.data.tags["relflow.budget.front"] in ("front", "dominated")
        assert "relbench.roc_auc.ci_low" in m
    # longer posts: more present cells per prediction
    short, long_ = by_length["2"].data.metrics, by_length["8"].data.metrics
    assert long_["budget.cells_present_per_prediction"] > short["budget.cells_present_per_prediction"]
    front = sum(c.data.metrics.get("budget.on_front", 0) for c in children)
    assert parent.data.metrics["budget.front_points"] == front >= 1

    for name in ("budget.md", "budget.json", "budget.html", "budget.png"):
        assert (out / name).is_file(), name
    arts = {a.path for a in client.list_artifacts(parent_id, "budget")}
    assert {"budget/budget.md", "budget/budget.html", "budget/budget.png", "budget/budget.json"} <= arts
    md = (out / "budget.md").read_text()
    assert "posts.max_length=2" in md or "max_length=2" in md
    assert "Pareto" in md and "relbench.roc_auc" in md
