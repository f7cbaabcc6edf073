"""Bad input through the real CLI: exit 2, one paragraph naming the culprit, nothing left over.

Each case runs ``python -m flows.cli run SPEC`` in its own folder (cwd, so ``./outputs`` and
``./mlflow.db`` land there) with its own MLflow store and ``PREFECT_HOME``. Spec and source
errors (files, columns, keys, empty tables) stop before Prefect starts, in a few seconds;
``overflow: error`` is found in the data, after Prefect's temporary server started and the
MLflow run began (15-30 s): it runs the default TPC-H workload with
``--set lineitem.max_length=2 --set lineitem.overflow=error``. All cases run once per
module, the slow one beside the quick ones, and each test reads its own result.

Named ``test_app_errors.py`` (tests/README.md): test_app.py holds the app's own tests; this file is
one aspect of ``run``/``data`` (flows/cli/app.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from tests.repo import REPO

pytestmark = pytest.mark.slow  # every case is a real `python -m flows.cli run` process

DEFAULT_SPEC = REPO / "benchmarks" / "tpch_orders.yaml"
TIMEOUT_S = 300


@dataclass
class Case:
    edit: Any  # (spec dict, tables dict) -> None, mutating both
    names: list[str]  # what the message must mention
    in_flow: bool  # found inside the flow (Prefect started, MLflow run begun), not before
    args: list[str] = field(default_factory=list)
    tpch: bool = False  # run the default TPC-H workload instead of the shop tables


def _set(path: list, value):
    def edit(spec, tables):
        node = spec
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value

    return edit


def _missing_column(spec, tables):
    spec["schema"]["branches"][0]["columns"]["o_priority"] = "category"


def _bad_parent_key(spec, tables):
    spec["schema"]["branches"][0]["parent_key"] = "o_customer"


def _empty_lines(spec, tables):
    tables["lines"] = tables["lines"].slice(0, 0)


CASES: dict[str, Case] = {
    "unknown-key": Case(_set(["run", "batchsize"], 64), ["unknown key 'run.batchsize'", "fix its spelling"], False),
    "mistyped-value": Case(_set(["run", "batch_size"], "big"), ["run.batch_size", "'big'"], False),
    "bad-override": Case(
        lambda s, t: None,
        ["'schema.branches.orders.max_length'", "greater than 0"],
        False,
        args=["--set", "orders.max_length=0"],
    ),
    "missing-file": Case(
        _set(["source", "tables", "orders"], "nope.parquet"),
        ["Table 'orders'", "nope.parquet", "does not exist", "source.tables.orders"],
        False,
    ),
    "missing-column": Case(_missing_column, ["Column 'o_priority'", "table 'orders'", "Fix the spec"], False),
    "missing-parent-key": Case(
        _bad_parent_key, ["'o_customer'", "parent_key", "table 'orders'", "Fix the spec"], False
    ),
    "empty-table": Case(_empty_lines, ["Table 'lines'", "is empty", "source.tables"], False),
    "overflow-error": Case(
        lambda s, t: None,
        ["Branch 'lineitem'", "overflow: error", "max_length to at least 7"],
        True,
        args=["--set", "lineitem.max_length=2", "--set", "lineitem.overflow=error"],
        tpch=True,
    ),
}


@dataclass
class Result:
    folder: Path
    returncode: int
    stdout: str
    stderr: str

    @property
    def message(self) -> str:
        """The error paragraph, with the console's line wrapping undone."""
        text = self.stderr[self.stderr.rfind("error:") :]
        return " ".join(text.split())


def _env(folder: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}",
            "PREFECT_HOME": str(folder / "prefect-home"),
            "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "COLUMNS": "100",
        }
    )
    env.pop("PREFECT_API_URL", None)  # never the session harness's server
    return env


def _prepare(name: str, case: Case, root: Path, shop_kit) -> tuple[Path, list[str]]:
    folder = root / name
    folder.mkdir()
    if case.tpch:
        return folder, [str(DEFAULT_SPEC), *case.args]
    spec, tables = shop_kit.spec(), shop_kit.tables()
    case.edit(spec, tables)
    for t_name, table in tables.items():
        shop_kit.write_table(table, folder / "data" / f"{t_name}.parquet")
    (folder / "data" / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder, [str(folder / "data" / "spec.yaml"), *case.args]


def _run(folder: Path, args: list[str]) -> Result:
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", *args],
        cwd=folder,
        env=_env(folder),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    return Result(folder, proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory, tpch_small, shop_kit) -> dict[str, Result]:
    """Every case run once through the CLI: the Prefect case beside the quick ones."""
    root = tmp_path_factory.mktemp("cli")
    jobs = {name: _prepare(name, case, root, shop_kit) for name, case in CASES.items()}
    # the slow (in-flow) case first, so the quick ones run beside it (2 cores)
    order = sorted(jobs, key=lambda n: not CASES[n].in_flow)
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(_run, *jobs[name]) for name in order}
        return {name: f.result() for name, f in futures.items()}


def _runs(folder: Path) -> list:
    db = folder / "mlflow.db"
    if not db.exists():
        return []
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    ids = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(ids) if ids else []


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_exits_2_with_one_paragraph_naming_the_culprit(cli_results, name):
    r = cli_results[name]
    assert r.returncode == 2, r.stderr[-3000:]
    assert "error:" in r.stderr
    paragraph = r.stderr[r.stderr.rfind("error:") :].strip()
    assert "\n\n" not in paragraph, "one paragraph"
    for part in CASES[name].names:
        assert part in r.message, (part, r.message)
    assert "failed:" not in r.stderr  # a UserError, not an unexpected failure


def test_overflow_error_names_an_order_with_the_most_lines(cli_results, tpch_small):
    key = int(re.search(r"parent key (\d+) has (\d+) rows", cli_results["overflow-error"].message)[1])
    counts = pl.read_parquet(tpch_small / "lineitem.parquet", columns=["l_orderkey"]).group_by("l_orderkey").len()
    assert counts["len"].max() == 7
    assert counts.filter(pl.col("l_orderkey") == key)["len"].item() == 7


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_leaves_no_run_running_and_no_files(cli_results, name):
    r = cli_results[name]
    runs = _runs(r.folder)
    assert not [run for run in runs if run.info.status == "RUNNING"]
    if name == "overflow-error":  # raised after the run started: it must end FAILED
        assert [run.info.status for run in runs] == ["FAILED"]
        error = runs[0].data.tags.get("relflow.error", "")
        assert "Branch 'lineitem'" in error and "max_length to at least 7" in error
    else:  # every other check runs before the MLflow run starts
        assert runs == []
    outputs = r.folder / "outputs"
    left = sorted(p.name for p in outputs.rglob("*")) if outputs.exists() else []
    assert not [n for n in left if n.endswith(".parquet") or ".tmp-" in n], left


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_prints_no_traceback(cli_results, name):
    assert "Traceback" not in cli_results[name].stderr


def test_debug_shows_the_traceback(tmp_path, shop_spec):
    shop_spec["run"]["batchsize"] = 64
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(shop_spec))
    r = _run(tmp_path, [str(spec), "--debug"])
    assert r.returncode != 0
    assert "Traceback" in r.stderr
    assert "run.batchsize" in r.stderr
    assert not (tmp_path / "mlflow.db").exists()


def test_missing_spec_file(tmp_path):
    r = _run(tmp_path, [str(tmp_path / "nope.yaml")])
    assert r.returncode == 2
    assert "nope.yaml" in r.message and "does not exist" in r.message
    assert "Traceback" not in r.stderr
