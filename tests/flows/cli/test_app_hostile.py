"""Hostile input and broken surroundings through the real CLI (issues 9 and 24): each ends in exit 2
within seconds, before Prefect starts, with one paragraph naming the table/file/column/key
or URI and the fix; no traceback, no MLflow run, no output file.

Each case runs ``python -m flows.cli run SPEC`` in its own folder on the shop tables
(tests/conftest.py), edited to break one thing. The shop has no validation rows at the
default split, so cases about something else run in predict mode.

Named ``test_app_hostile.py`` (tests/README.md): test_app.py holds the app's own tests; this file is
one aspect of ``run``/``data`` (flows/cli/app.py).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.repo import REPO

pytestmark = pytest.mark.slow  # 21 real `python -m flows.cli run` processes


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Case:
    edit: Any  # (spec, tables, folder) -> None, mutating spec and tables, writing extra files
    names: list[str]
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    train: bool = False  # keep train+predict (target checks)
    spec_text: Any = None  # str -> str: the written spec YAML, edited as text (aliases, nesting)


def _col(table: str, name: str, values, type_=None):
    def edit(spec, tables, folder):
        t = tables[table]
        tables[table] = t.set_column(t.schema.get_field_index(name), name, pa.array(values, type_))

    return edit


def _dupes(spec, tables, folder):
    tables["customers"] = pa.concat_tables([tables["customers"], tables["customers"].slice(1, 1)])


def _padded(spec, tables, folder):
    _col("customers", "c_id", [f"{k:04d}" for k in range(1, 6)])(spec, tables, folder)
    _col("orders", "o_cust", ["1", "1", "1", "2", "4", "4", "5", "99"])(spec, tables, folder)


def _folder_tz(spec, tables, folder):
    lines = tables.pop("lines").append_column("l_ts", pa.array([None] * 11, pa.timestamp("us")))
    (folder / "lines").mkdir()
    pq.write_table(lines.slice(0, 5), folder / "lines" / "part-0.parquet")
    b = lines.slice(5)
    b = b.set_column(b.schema.get_field_index("l_ts"), "l_ts", b["l_ts"].cast(pa.timestamp("us", tz="UTC")))
    pq.write_table(b, folder / "lines" / "part-1.parquet")
    spec["source"]["tables"]["lines"] = "lines"
    spec["schema"]["branches"][0]["branches"][0]["columns"]["l_ts"] = "timestamp"


def _corrupt(spec, tables, folder):
    pq.write_table(tables.pop("orders"), folder / "orders.parquet")
    raw = (folder / "orders.parquet").read_bytes()
    (folder / "orders.parquet").write_bytes(raw[: len(raw) // 2])


def _empty_folder(spec, tables, folder):
    (folder / "lines").mkdir()
    (folder / "lines" / "notes.txt").write_text("the export failed")
    spec["source"]["tables"]["lines"] = "lines"
    tables.pop("lines")


def _noop(spec, tables, folder):
    pass


def _lock_folder(spec, tables, folder):
    (folder / "lock-is-a-folder").mkdir()


def _target_is_key(spec, tables, folder):
    spec["task"]["target"] = spec["schema"]["root"]["key"]


# Nine-fold aliases, six levels: 531,441 leaves from 0.4 KB (the 1.4 KB document went
# further and ate 19.6 GB); under run.compile.options, the free-form mapping.
_LAUGHS = "".join(
    f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else ', '.join(['lol'] * 9)}]\n" for i in range(6)
)


def _laughs(text: str) -> str:
    return text + "laughs:\n" + _LAUGHS


def _too_deep(text: str) -> str:
    return text + "deep: " + "[" * 200 + "]" * 200 + "\n"


PORT = _closed_port()
CASES: dict[str, Case] = {
    "infinite-values": Case(
        _col("customers", "c_balance", [float("inf"), 1.0, 2.0, -float("inf"), 3.0]),
        ["Column 'c_balance' of table 'customers'", "2 infinite", "Replace them"],
    ),
    "key-int-vs-string": Case(
        _col("orders", "o_cust", ["1", "1", "1", "2", "4", "4", "5", "99"]),
        ["Branch 'orders'", "'o_cust'", "String", "'c_id'", "Int64"],
    ),
    "key-zero-padded": Case(_padded, ["Branch 'orders': none of its 8 rows joins a parent", "'0001'", "zero-padding"]),
    "folder-schemas-differ": Case(
        _folder_tz, ["Table 'lines'", "'l_ts'", "part-0.parquet", "part-1.parquet", "tz=UTC"]
    ),
    "duplicate-root-keys": Case(_dupes, ["Table 'customers'", "1 duplicate root key", "De-duplicate"]),
    "target-all-null": Case(
        _col("customers", "churn", [None] * 5, pa.string()), ["task.target 'churn'", "no labelled rows"], train=True
    ),
    "target-too-few": Case(
        _noop, ["task.target 'churn'", "0 in the validation split", "task.validation_fraction"], train=True
    ),
    "corrupt-parquet": Case(_corrupt, ["Table 'orders'", "orders.parquet", "corrupt"]),
    "folder-without-data": Case(_empty_folder, ["Table 'lines'", "holds no data files", "notes.txt"]),
    "device-banana": Case(
        _noop, ["run.device 'banana' is not a device", "cuda:<index>"], args=["--set", "run.device=banana"]
    ),
    "memory-budget": Case(
        _noop,
        ["memory budget is 1,000 bytes", "run.chunk_rows", "max_length"],
        args=["--set", "run.max_memory_bytes=1000"],
    ),
    "output-dir-unwritable": Case(
        _noop,
        ["run.output_dir", "is not writable", "--set run.output_dir"],
        args=["--set", "run.output_dir=/proc/relflow-out"],
    ),
    "tracking-unreachable": Case(
        _noop,
        [f"http://127.0.0.1:{PORT}", "cannot be reached", "MLFLOW_TRACKING_URI"],
        env={"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{PORT}"},
    ),
    "tracking-credentials-in-uri": Case(  # refused before it is ever shown or tried
        _noop,
        ["MLFLOW_TRACKING_URI carries credentials", "MLFLOW_TRACKING_PASSWORD"],
        env={"MLFLOW_TRACKING_URI": f"http://alice:s3cret@127.0.0.1:{PORT}"},
    ),
    # issue 24
    "spec-billion-laughs": Case(
        _noop, ["YAML aliases are not allowed", "'*l0'", "Write the values out"], spec_text=_laughs
    ),
    "spec-nested-too-deep": Case(_noop, ["nests deeper than 64 levels", "MAX_SPEC_DEPTH"], spec_text=_too_deep),
    "tracking-credentials-upper-case-scheme": Case(
        _noop,
        ["MLFLOW_TRACKING_URI carries credentials", "HTTP://***@127.0.0.1", "MLFLOW_TRACKING_PASSWORD"],
        env={"MLFLOW_TRACKING_URI": f"HTTP://alice:s3cret@127.0.0.1:{PORT}"},
    ),
    "lock-file-is-a-folder": Case(
        _lock_folder, ["host lock file", "lock-is-a-folder", "is a folder", "RELFLOW_LOCK_FILE"], env={"LOCK": "dir"}
    ),
    "target-is-the-root-key": Case(
        _target_is_key, ["task.target 'c_id' is schema.root.key", "not predicted"], train=True
    ),
    "null-root-keys": Case(
        _col("customers", "c_id", [None, None, 3, 4, 5], pa.int64()),
        ["Table 'customers'", "2 of 5 rows with a null root key", "'c_id'"],
    ),
    "tracking-sqlite-unwritable": Case(
        _noop,
        ["sqlite:////proc/relflow/mlflow.db", "not writable"],
        env={"MLFLOW_TRACKING_URI": "sqlite:////proc/relflow/mlflow.db"},
    ),
}


@dataclass
class Result:
    folder: Path
    returncode: int
    stderr: str
    seconds: float

    @property
    def message(self) -> str:
        return " ".join(self.stderr[self.stderr.rfind("error:") :].split())


def _env(folder: Path, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}",
            "PREFECT_HOME": str(folder / "prefect-home"),
            "COLUMNS": "100",
            "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        }
    )
    env.pop("PREFECT_API_URL", None)
    env.update(extra)
    return env


def _run(folder: Path, args: list[str], extra: dict[str, str]) -> Result:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", *args],
        cwd=folder,
        env=_env(folder, extra),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return Result(folder, proc.returncode, proc.stderr, time.monotonic() - start)


def _prepare(name: str, case: Case, root: Path, shop_kit) -> tuple[Path, list[str], dict[str, str]]:
    folder = root / name
    data = folder / "data"
    data.mkdir(parents=True)
    spec, tables = shop_kit.spec(), shop_kit.tables()
    if not case.train:
        spec["run"]["mode"] = "predict"
    case.edit(spec, tables, data)
    for t_name, table in tables.items():
        shop_kit.write_table(table, data / f"{t_name}.parquet")
    text = yaml.safe_dump(spec, sort_keys=False)
    (data / "spec.yaml").write_text(case.spec_text(text) if case.spec_text else text)
    env = dict(case.env)
    if env.pop("LOCK", None):
        env["RELFLOW_LOCK_FILE"] = str(data / "lock-is-a-folder")
    return folder, [str(data / "spec.yaml"), *case.args], env


@pytest.fixture(scope="module")
def results(request, tmp_path_factory, shop_kit) -> dict[str, Result]:
    # Only the cases the session selected (``-k``) run: each is a CLI process.
    wanted = {
        item.callspec.params["name"]
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    }
    root = tmp_path_factory.mktemp("hostile")
    jobs = {name: _prepare(name, case, root, shop_kit) for name, case in CASES.items() if name in wanted}
    not_utf8 = root / "not-utf8"
    not_utf8.mkdir()
    (not_utf8 / "spec.yaml").write_bytes(b"name: caf\xe9\n")
    if "spec-not-utf8" in wanted:
        jobs["spec-not-utf8"] = (not_utf8, [str(not_utf8 / "spec.yaml")], {})
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(_run, *job) for name, job in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


NAMES = {
    **{n: c.names for n, c in CASES.items()},
    "spec-not-utf8": ["spec.yaml", "is not UTF-8", "byte 0xe9", "save it as UTF-8"],
}


@pytest.mark.parametrize("name", list(NAMES))
def test_exit_2_naming_the_cause_before_any_work(results, name):
    r = results[name]
    assert r.returncode == 2, r.stderr[-3000:]
    for part in NAMES[name]:
        assert part in r.message, (part, r.message)
    assert "Traceback" not in r.stderr and "failed:" not in r.stderr
    assert "s3cret" not in r.stderr and "alice" not in r.stderr


@pytest.mark.parametrize("name", list(NAMES))
def test_no_run_and_no_output_file_is_left(results, name):
    r = results[name]
    db = r.folder / "mlflow.db"
    if db.exists():
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{db}")
        exps = [e.experiment_id for e in client.search_experiments()]
        assert not (client.search_runs(exps) if exps else [])
    outputs = r.folder / "outputs"
    assert not (list(outputs.rglob("*")) if outputs.exists() else [])


def test_spec_and_settings_errors_come_before_torch_prefect_and_mlflow_are_imported(tmp_path, shop_spec):
    """Issue 24: bad input exited after 10-15 s of imports; now the spec and the settings are
    checked first (the times are in the issue's note; here what was imported is checked)."""
    bad = dict(shop_spec, bogus=1)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(bad))
    for extra in ({}, {"MLFLOW_TRACKING_URI": f"HTTP://alice:s3cret@127.0.0.1:{PORT}"}):
        spec = tmp_path / ("spec.yaml" if not extra else "good.yaml")
        if extra:
            spec.write_text(yaml.safe_dump(shop_spec))
        env = {**_env(tmp_path, extra), "PYTHONPROFILEIMPORTTIME": "1"}
        proc = subprocess.run(
            [sys.executable, "-m", "flows.cli", "run", str(spec)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2, proc.stderr[-2000:]
        imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
        assert imported, "no -X importtime output"
        assert not imported & {"torch", "prefect", "mlflow"}, sorted(imported & {"torch", "prefect", "mlflow"})
