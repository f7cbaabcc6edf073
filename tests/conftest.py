"""Session set-up shared by every test, and small hand-made workloads.

The environment is fixed here, at import time, because Prefect reads its settings when it is
first imported: a throwaway ``PREFECT_HOME``, no analytics, a generous start-up timeout for
the temporary server on a busy 2-core machine, quiet logs, no MLflow telemetry, and a
private ``RELFLOW_DATA_DIR`` so no test reads or writes ``./data``, a private host lock
file so tests neither wait for nor block a real benchmark on this machine, and this checkout
first on ``PYTHONPATH`` for every subprocess a test starts.

Fixtures:
- ``prefect_harness``: one ``prefect_test_harness()`` per session (~13 s), requested only by
  flow tests, so the unit tests never start a server.
- ``_cli_prefect_server`` (automatic, only when slow tests are selected): one real
  ``prefect server start`` on 127.0.0.1 for the session, exported as ``PREFECT_API_URL`` to
  every subprocess a test starts. Each ``relflow-bench run`` subprocess otherwise booted a
  temporary server of its own (measured 54.8 s vs 24.5 s for one small run on a loaded
  host). Tests about standalone behaviour (the temporary server, its clean-up, orphans)
  remove ``PREFECT_API_URL`` from their subprocess's environment, as before.
- ``mlflow_uri``: a temp SQLite store, exported as ``MLFLOW_TRACKING_URI``.
- ``tpch_small``: TPC-H at scale 0.01, generated once per session with ``ensure_tpch``.
- ``shop_tables`` / ``shop_spec`` / ``write_tables``: a two-level nested workload
  (customers -> orders -> lines) small enough to check every figure by hand.
"""

from __future__ import annotations

import atexit
import copy
import datetime as dt
import os
import shutil
import tempfile
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

_SESSION_DIR = Path(tempfile.mkdtemp(prefix="relflow-tests-"))
atexit.register(shutil.rmtree, _SESSION_DIR, ignore_errors=True)

os.environ["PREFECT_HOME"] = str(_SESSION_DIR / "prefect-home")
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")  # more on a loaded host
os.environ["PREFECT_LOGGING_LEVEL"] = "WARNING"
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
os.environ["RELFLOW_DATA_DIR"] = str(_SESSION_DIR / "data")
# The host lock serialises real benchmarks; tests must not queue behind one (or block it).
os.environ["RELFLOW_LOCK_FILE"] = str(_SESSION_DIR / "host.lock")
# The peak-FLOPs cache (MFU) is per host; tests keep theirs private.
os.environ["RELFLOW_CACHE_DIR"] = str(_SESSION_DIR / "cache")
# Subprocesses the tests start (`python -m flows.cli`, workers, torchrun) import this checkout,
# whatever checkout the editable install happens to point at.
_ROOT = str(Path(__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH", "")) if p)
# Triton kernels (tasks/backends/triton) run on CPU tensors in Triton's interpreter. Triton reads
# this when it is imported and again inside later lazy imports (its own jit helpers, gluon), so
# it is set here, before anything can import triton, and kept for the whole session.
os.environ.setdefault("TRITON_INTERPRET", "1")
# A tracking URI inherited from the shell must never receive test runs.
os.environ.pop("MLFLOW_TRACKING_URI", None)

import pyarrow as pa  # noqa: E402
import pyarrow.csv as pacsv  # noqa: E402
import pyarrow.feather as feather  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402

from tests.sigterm import stop_on_sigterm  # noqa: E402

SCALE = 0.01


def pytest_configure(config: pytest.Config) -> None:
    stop_on_sigterm()  # a killed session still stops the servers its fixtures started


# --- two workers (pytest-xdist; pyproject.toml's addopts: -n auto --dist loadgroup) ----------
#
# A serial suite kept 0.8 of this machine's 2 cores busy: most of a test's time is a
# subprocess importing torch/Prefect/MLflow, a server starting or a browser waiting. Every
# test is already written for a host shared with other work (timed runs that must be VALID set
# run.max_host_load, nothing asserts an absolute time, every server takes a free port), so a
# second worker is safe. Each worker is its own session: its own folder, data, host lock file and
# Prefect/PostgreSQL/browser fixtures.

# Session fixtures whose runs cost minutes (tests/dashboards/conftest.py): the tests that use
# them share one worker, so those runs are made once in the suite, not once per worker.
SHARED_RUN_FIXTURES = frozenset({"bench_runs", "trace_run"})
# Folders whose files run one after another in one worker: the DDP tests' torchrun jobs (2 ranks
# of 2 threads each) never overlap, as two would oversubscribe the 2 cores 4x over gloo.
ONE_WORKER_FOLDERS = {"tests/tasks/run/distributed/": "torchrun"}


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers, or one on a one-core machine. More would not help a 2-core CI
    machine, and on a big one each worker boots its own servers and timed runs."""
    return min(2, os.cpu_count() or 1)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test's xdist group: its file (module fixtures are made once, in one worker), its
    folder's on ``ONE_WORKER_FOLDERS``, or the one group of the tests that share the dashboards'
    session runs."""
    for item in items:
        path = item.nodeid.split("::")[0]
        group = next((g for folder, g in ONE_WORKER_FOLDERS.items() if path.startswith(folder)), path)
        if SHARED_RUN_FIXTURES & set(getattr(item, "fixturenames", ())):
            group = "dashboard-runs"
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def session_dir() -> Path:
    """The session's private folder (PREFECT_HOME and RELFLOW_DATA_DIR live under it)."""
    return _SESSION_DIR


@pytest.fixture(scope="session", autouse=True)
def _cli_prefect_server(request: pytest.FixtureRequest):
    """One Prefect server for the CLI subprocesses of a session with slow tests in it (see the
    module docstring); its services that only matter for deployments and schedules are off,
    so an idle server costs the host next to nothing."""
    wanted = any(item.get_closest_marker("slow") for item in request.session.items)
    if not wanted or os.environ.get("PREFECT_API_URL"):
        yield None
        return
    from pgserver import running_prefect_server

    quiet = {
        f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false"
        for name in ("SCHEDULER", "LATE_RUNS", "FOREMAN", "PAUSE_EXPIRATIONS", "CANCELLATION_CLEANUP", "REPOSSESSOR")
    }
    with running_prefect_server(_SESSION_DIR / "cli-prefect-server", env=quiet) as api:
        os.environ["PREFECT_API_URL"] = api
        try:
            yield api
        finally:
            os.environ.pop("PREFECT_API_URL", None)


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect server for the whole session (only flow tests ask for it)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=None):
        yield


@pytest.fixture
def mlflow_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh SQLite MLflow store for one test, exported as MLFLOW_TRACKING_URI."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(scope="session")
def tpch_small() -> Path:
    """TPC-H Parquet at scale 0.01 in the session's data folder, generated once."""
    from tasks.datasets.tpch import ensure_tpch

    folder, _ = ensure_tpch(SCALE)
    return folder


# --- a two-level nested workload, small enough to check by hand -----------------------
#
# customers (root, key c_id)            5 rows; customer 3 has no orders
#   orders (parent_key o_cust, key o_id) 7 rows + 1 orphan (o_cust 99)
#     lines (parent_key l_order)         10 rows + 1 orphan (l_order 99)
#
# customer 1 has 3 orders (one over orders.max_length 2), order 10 has 4 lines (one over
# lines.max_length 3), order 12 (customer 1's latest, dropped by keep_first on o_date) has
# 2 lines: structurally skipped, not overflow.


def _date(s: str | None) -> dt.date | None:
    return None if s is None else dt.date.fromisoformat(s)


def _ts(s: str | None) -> dt.datetime | None:
    return None if s is None else dt.datetime.fromisoformat(s)


def make_shop_tables() -> dict[str, pa.Table]:
    customers = pa.table(
        {
            "c_id": pa.array([1, 2, 3, 4, 5], pa.int64()),
            "c_balance": pa.array([10.0, None, 30.0, 40.0, 50.0], pa.float64()),
            "c_segment": pa.array(["a", "b", None, "a", "c"], pa.string()),
            "c_since": pa.array(
                [_date(d) for d in ("2020-01-01", "2021-06-01", None, "2019-03-03", "2022-12-31")], pa.date32()
            ),
            "churn": pa.array(["yes", "no", "no", "yes", "no"], pa.string()),
        }
    )
    orders = pa.table(
        {
            "o_id": pa.array([10, 11, 12, 20, 40, 41, 50, 99], pa.int64()),
            "o_cust": pa.array([1, 1, 1, 2, 4, 4, 5, 99], pa.int64()),
            "o_date": pa.array(
                [
                    _ts(t)
                    for t in (
                        "2024-01-01 10:00:00",
                        "2024-02-01 10:00:00",
                        "2024-03-01 10:00:00",
                        None,
                        "2024-01-15 08:00:00",
                        "2024-01-10 08:00:00",
                        "2024-05-05 12:00:00",
                        "2024-01-01 00:00:00",
                    )
                ],
                pa.timestamp("us"),
            ),
            "o_total": pa.array(
                [
                    Decimal(x) if x is not None else None
                    for x in ("100.50", "200.00", None, "50.25", "10.00", "20.00", "5.00", "1.00")
                ],
                pa.decimal128(10, 2),
            ),
            "o_status": pa.array(["open", "done", "open", None, "done", "open", "new", "open"], pa.string()),
        }
    )
    lines = pa.table(
        {
            "l_order": pa.array([10, 10, 10, 10, 11, 12, 12, 20, 41, 41, 99], pa.int64()),
            "l_no": pa.array([1, 2, 3, 4, 1, 1, 2, 1, 2, 1, 1], pa.int64()),
            "l_qty": pa.array([1.0, 2.0, None, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0], pa.float64()),
            "l_flag": pa.array(["A", "B", "A", None, "B", "A", "A", "B", "A", "B", "A"], pa.string()),
        }
    )
    return {"customers": customers, "orders": orders, "lines": lines}


def make_shop_spec(fmt: str = "parquet") -> dict[str, Any]:
    suffix = {"parquet": "parquet", "ipc": "arrow", "csv": "csv"}[fmt]
    return {
        "name": "shop",
        "source": {"tables": {t: f"{t}.{suffix}" for t in ("customers", "orders", "lines")}},
        "schema": {
            "root": {
                "table": "customers",
                "key": "c_id",
                "columns": {"c_balance": "numeric", "c_segment": "category", "c_since": "timestamp"},
            },
            "branches": [
                {
                    "name": "orders",
                    "table": "orders",
                    "parent_key": "o_cust",
                    "key": "o_id",
                    "order_by": {"column": "o_date"},
                    "max_length": 2,
                    "overflow": "keep_first",
                    "columns": {"o_date": "timestamp", "o_total": "numeric", "o_status": "category"},
                    "branches": [
                        {
                            "name": "lines",
                            "table": "lines",
                            "parent_key": "l_order",
                            "order_by": {"column": "l_no"},
                            "max_length": 3,
                            "overflow": "keep_first",
                            "columns": {"l_qty": "numeric", "l_flag": "category"},
                        }
                    ],
                }
            ],
        },
        "task": {"target": "churn", "kind": "category"},
        "model": {"d_model": 8, "layers": 1, "heads": 2},
        "run": {"batch_size": 4, "epochs": 1, "warmup_batches": 0, "device": "cpu"},
    }


def write_table(table: pa.Table, path: Path) -> Path:
    """One table as Parquet, Arrow IPC or CSV, chosen by the file suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        pq.write_table(table, path)
    elif path.suffix in {".arrow", ".ipc", ".feather"}:
        feather.write_feather(table, path, compression="uncompressed")
    elif path.suffix == ".csv":
        pacsv.write_csv(table, path)
    else:
        raise ValueError(f"unknown suffix {path.suffix}")
    return path


@pytest.fixture(scope="session")
def shop_kit() -> SimpleNamespace:
    """The shop builders for session/module-scoped fixtures (tests/ is not a package)."""
    return SimpleNamespace(tables=make_shop_tables, spec=make_shop_spec, write_table=write_table)


@pytest.fixture
def shop_tables() -> dict[str, pa.Table]:
    return make_shop_tables()


# Integers float64 cannot hold exactly (ids or hashes a user declares numeric): every library
# must take them, rounded, as the reference model always has.
BIG_BALANCES = [2**62, None, 3, 2**53 + 1, -(2**60)]


@pytest.fixture
def shop_tables_big_ints(shop_tables) -> dict[str, pa.Table]:
    """The shop with ``c_balance`` (numeric) as int64 beyond 2**53 (``BIG_BALANCES``)."""
    c = shop_tables["customers"]
    col = c.schema.get_field_index("c_balance")
    return dict(shop_tables, customers=c.set_column(col, "c_balance", pa.array(BIG_BALANCES, pa.int64())))


# Every Arrow type a column declared timestamp may arrive in: timestamps of each unit, naive or
# zoned (pandas writes ns to Parquet; ns since 1970 pass 2**53, so a checked float64 cast
# refuses them), and dates.
TIME_TYPES = [
    *(pa.timestamp(unit, tz) for tz in (None, "UTC", "Asia/Kolkata") for unit in ("s", "ms", "us", "ns")),
    pa.date32(),
    pa.date64(),
]


@pytest.fixture(params=TIME_TYPES, ids=str)
def time_type(request) -> pa.DataType:
    """Each of ``TIME_TYPES`` in turn."""
    return request.param


@pytest.fixture
def shop_tables_times(shop_tables, time_type) -> dict[str, pa.Table]:
    """The shop with both timestamp columns (``c_since``, a date, and ``o_date``, whole hours)
    stored as ``time_type``: the same instants, naive values read as UTC by zoned types, and
    dates keep the day (``o_date``'s hour dropped)."""

    def as_type(arr: pa.ChunkedArray) -> pa.ChunkedArray:
        if pa.types.is_timestamp(time_type) and pa.types.is_timestamp(arr.type):
            arr = arr.cast(pa.timestamp(arr.type.unit, time_type.tz))  # UTC ticks kept
        return arr.cast(time_type, safe=False)  # to a date: the hour dropped

    c, o = shop_tables["customers"], shop_tables["orders"]
    return dict(
        shop_tables,
        customers=c.set_column(c.schema.get_field_index("c_since"), "c_since", as_type(c["c_since"])),
        orders=o.set_column(o.schema.get_field_index("o_date"), "o_date", as_type(o["o_date"])),
    )


@pytest.fixture
def shop_spec() -> dict[str, Any]:
    """A fresh (mutable) spec dict for the shop workload, reading Parquet."""
    return copy.deepcopy(make_shop_spec())


@pytest.fixture
def write_tables(tmp_path: Path):
    """``write_tables(tables, fmt="parquet", folder=tmp_path) -> folder``."""

    def write(tables: dict[str, pa.Table], fmt: str = "parquet", folder: Path | None = None) -> Path:
        folder = folder or tmp_path
        suffix = {"parquet": ".parquet", "ipc": ".arrow", "csv": ".csv"}[fmt]
        for name, table in tables.items():
            write_table(table, folder / f"{name}{suffix}")
        return folder

    return write


@pytest.fixture
def shop_files(write_tables, shop_tables) -> Path:
    """The shop tables as Parquet in tmp_path (the folder shop_spec's paths resolve from)."""
    return write_tables(shop_tables)


@pytest.fixture
def shop4_files(write_tables, shop_tables):
    """Four copies of the shop tables under shifted keys: 20 customers, so the hash split
    holds out 5 (both classes, as does the training side); the single shop holds out none
    (the ONNX Runtime flow and the noise CLI's runs)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    shift = {"customers": {"c_id": 100}, "orders": {"o_id": 1000, "o_cust": 100}, "lines": {"l_order": 1000}}
    out = {}
    for name, table in shop_tables.items():
        copies = []
        for k in range(4):
            t = table
            for col, step in shift[name].items():
                i = t.schema.get_field_index(col)
                t = t.set_column(i, col, pc.add(t[col], pa.scalar(step * k, pa.int64())))
            copies.append(t)
        out[name] = pa.concat_tables(copies)
    return write_tables(out)


@pytest.fixture
def prepare_chunk():
    """``prepare_chunk(spec_dict, folder) -> (spec, encoding, schema, tensorized)``: every root
    key as one chunk through the harness's chain (tasks/run/chain.py), untimed, no Prefect."""
    import torch

    from tasks.run.chain import Chain
    from tasks.sources.files import resolve_sources
    from tasks.spec import parse_spec
    from tasks.stages.retrieve import list_root_keys

    def prepare(spec_dict: dict[str, Any], folder: Path):
        spec = parse_spec(spec_dict)
        chain = Chain(spec, resolve_sources(spec, folder), torch.device("cpu"))
        keys, _ = list_root_keys(spec, chain.sources)
        tz = chain.prepare_untimed(keys)
        return spec, chain.encoding, chain.schema, tz

    return prepare


# --- a headless browser (Playwright driving Debian's chromium) --------------------------

CHROMIUM = os.environ.get("RELFLOW_CHROMIUM", "/usr/bin/chromium")
# Playwright's own browser download is not reachable here: it drives the system chromium.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def chromium() -> str:
    """Path of the system chromium. Absent: a skip naming the set-up step, except in CI
    (``CI`` set, as ``.ci/run`` does), where it is an error: CI must run the browser tests."""
    if not Path(CHROMIUM).exists():
        message = (
            f"{CHROMIUM} is absent: install Debian's chromium (`apt-get install -y chromium`, "
            "what .ci/run does as root) or point RELFLOW_CHROMIUM at a Chromium binary"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM


@pytest.fixture(scope="session")
def browser(chromium):
    """One headless Chromium for the session (Playwright's sync API)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    """A fresh page whose console errors and uncaught exceptions are collected in ``page.errors``."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    p = context.new_page()
    p.errors = []
    p.on("console", lambda m: p.errors.append(m.text) if m.type in ("error", "assert") else None)
    p.on("pageerror", lambda e: p.errors.append(str(e)))
    yield p
    context.close()


@pytest.fixture(scope="session")
def postgres_server():
    """A real PostgreSQL on 127.0.0.1 for the session with password authentication
    (tests/pgserver.py); PGPASSWORD is set for its user. Skipped with the reason when no
    server is installed, except under CI."""
    from pgserver import PASSWORD, private_dir, running_postgres

    old = os.environ.get("PGPASSWORD")
    with private_dir("relflow-pg-") as folder, running_postgres(folder / "pg", password=PASSWORD) as server:
        os.environ["PGPASSWORD"] = PASSWORD
        try:
            yield server
        finally:
            from tasks.sources.databases import close_all

            close_all()
            if old is None:
                os.environ.pop("PGPASSWORD", None)
            else:
                os.environ["PGPASSWORD"] = old
