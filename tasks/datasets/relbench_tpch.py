"""``rel-tpch``: the generated TPC-H tables as a RelBench dataset folder with two forecast tasks.

Written once per scale next to the TPC-H Parquet (``<tpch folder>/rel-tpch``, e.g.
``data/tpch/sf0.01/rel-tpch``) in RelBench 3.0.2's format, so ``relbench.load.RelBenchDataset``
reads it offline:

- ``db/customer.parquet`` (pkey ``c_custkey``, no time column), ``db/orders.parquet`` (pkey
  ``o_orderkey``, fkey ``o_custkey`` -> customer, time ``o_orderdate``), ``db/lineitem.parquet``
  (no pkey: RelBench allows none, as for its event tables; fkey ``l_orderkey`` -> orders, time
  ``l_shipdate``). RelBench's key contract applies (``relbench_starter.apply_key_contract``):
  orders and line items sorted by their time column, primary keys ``0..N-1`` in that order,
  foreign keys remapped, dates as ``datetime64[ns]``, decimals as float64;
  ``keymap/<table>.parquet`` maps TPC-H's keys to the new ones (outside RelBench's format,
  which ignores it).
- ``val_timestamp`` 1997-06-01, ``test_timestamp`` 1998-01-01: TPC-H order dates span
  1992-01-01..1998-08-02, so the test window (to 1998-04-01) ends before the last order and the
  training seed times step back by 90 days from 1997-03-03 to 1992.
- ``tasks/customer-churn`` (binary): does a customer with an order at or before the seed time
  order again in the next 90 days (``orders_next_90d``, 0/1); ``tasks/customer-value``
  (regression): the total ``o_totalprice`` of their orders in the next 90 days
  (``value_next_90d``, 0 when none). Both are DuckDB SQL over ``timestamps`` and the db tables,
  and their labels are stored as ``{train,val,test}.parquet`` as RelBench's hosted tasks are:
  unmasked, in the canonical order of ``relbench.base.task_base.sort_labels`` (time, entity).

No ``remove_columns``: a label is an aggregate of the *orders placed after* the seed time,
i.e. of rows, not of a column. The as-of rule (only rows whose time column is at or before the
seed time) drops every one of those rows, and no column of an earlier row is computed from a
later order: ``o_totalprice`` is known when the order is placed, and TPC-H's status flags
(``o_orderstatus``, ``l_linestatus``, ``l_returnflag``) compare ship/receipt dates with the
generator's fixed "current date" 1995-06-17, not with the customer's later orders. Line items of
a visible order that ship after the seed time are themselves hidden by ``l_shipdate``.
"""

from __future__ import annotations

import shutil
import tempfile
from datetime import date, timedelta
from pathlib import Path
from typing import cast

import polars as pl

from tasks.datasets.relbench_starter import TableKeys, apply_key_contract, dataset_manifest, write_db
from tasks.runtime import interrupts

NAME = "rel-tpch"
TABLES = ("customer", "orders", "lineitem")
KEYS = {
    "customer": TableKeys(pkey="c_custkey"),
    "orders": TableKeys(pkey="o_orderkey", time_col="o_orderdate", fkeys={"o_custkey": "customer"}),
    "lineitem": TableKeys(time_col="l_shipdate", fkeys={"l_orderkey": "orders"}),
}
VAL_TIMESTAMP = "1997-06-01"
TEST_TIMESTAMP = "1998-01-01"
TIMEDELTA = "90 days"
WINDOW_DAYS = 90
SPLITS = ("train", "val", "test")

# Entities: customers with an order at or before the seed time (a customer who never ordered
# has no history to predict from). The window is RelBench's (t, t + timedelta].
CHURN_SQL = """
SELECT
    t.timestamp,
    c.c_custkey,
    CAST(EXISTS (
        SELECT 1 FROM orders o
        WHERE o.o_custkey = c.c_custkey
          AND o.o_orderdate > t.timestamp
          AND o.o_orderdate <= t.timestamp + INTERVAL '{timedelta}'
    ) AS INTEGER) AS orders_next_90d
FROM timestamps t, customer c
WHERE EXISTS (
    SELECT 1 FROM orders o
    WHERE o.o_custkey = c.c_custkey AND o.o_orderdate <= t.timestamp
)
"""
VALUE_SQL = """
SELECT
    t.timestamp,
    c.c_custkey,
    CAST(COALESCE((
        SELECT SUM(o.o_totalprice) FROM orders o
        WHERE o.o_custkey = c.c_custkey
          AND o.o_orderdate > t.timestamp
          AND o.o_orderdate <= t.timestamp + INTERVAL '{timedelta}'
    ), 0) AS DOUBLE) AS value_next_90d
FROM timestamps t, customer c
WHERE EXISTS (
    SELECT 1 FROM orders o
    WHERE o.o_custkey = c.c_custkey AND o.o_orderdate <= t.timestamp
)
"""
TASKS = {
    "customer-churn": {
        "task_type": "binary_classification",
        "target_col": "orders_next_90d",
        "description": "Will a customer who has ordered before the seed time order again in the next 90 days (1/0)?",
        "sql": CHURN_SQL,
    },
    "customer-value": {
        "task_type": "regression",
        "target_col": "value_next_90d",
        "description": "Total o_totalprice a customer who has ordered before the seed time orders in the "
        "next 90 days (0 when none).",
        "sql": VALUE_SQL,
    },
}


def rel_tpch_dir(tpch_folder: Path) -> Path:
    """Where ``ensure_rel_tpch`` writes the folder for the TPC-H Parquet in ``tpch_folder``."""
    return Path(tpch_folder) / NAME


def is_complete(folder: Path) -> bool:
    """Every file the folder must hold: manifests, tables, stored labels."""
    needed = [folder / "manifest.yaml", *(folder / "db" / f"{t}.parquet" for t in TABLES)]
    for task in TASKS:
        needed += [
            folder / "tasks" / task / "manifest.yaml",
            *(folder / "tasks" / task / f"{s}.parquet" for s in SPLITS),
        ]
    return all(p.is_file() for p in needed)


def ensure_rel_tpch(tpch_folder: Path) -> Path:
    """Return ``tpch_folder / "rel-tpch"``, writing it first (atomically) when it is not complete."""
    target = rel_tpch_dir(tpch_folder)
    if is_complete(target):
        return target
    tmp = Path(tempfile.mkdtemp(prefix=f".{NAME}-", dir=tpch_folder))
    # removed however this ends, a signal included
    with interrupts.removed_on_exit(lambda: shutil.rmtree(tmp, ignore_errors=True)):
        write_rel_tpch(Path(tpch_folder), tmp)
        if is_complete(target):
            return target  # another process finished first and may be reading it
        if target.exists():  # an incomplete folder from before: replace it
            shutil.rmtree(target)
        tmp.rename(target)
    return target


def write_rel_tpch(tpch_folder: Path, folder: Path) -> None:
    """Write the dataset into ``folder`` (an empty folder) from the TPC-H Parquet in ``tpch_folder``."""
    from relbench.manifest import TaskManifest

    frames = {t: pl.read_parquet(tpch_folder / f"{t}.parquet") for t in TABLES}
    _check_dates(frames["orders"])
    tables, keymaps = apply_key_contract(frames, KEYS)
    write_db(folder, tables, keymaps)
    manifest = dataset_manifest(
        NAME,
        VAL_TIMESTAMP,
        TEST_TIMESTAMP,
        KEYS,
        "TPC-H customers, orders and line items (generated by tpchgen-cli) with forecast tasks over "
        "customers; written by relflow-bench (tasks/datasets/relbench_tpch.py).",
    )
    manifest.save(folder / "manifest.yaml")  # type: ignore[attr-defined]
    for name, t in TASKS.items():
        TaskManifest(
            name=name,
            kind="forecast",
            task_type=t["task_type"],
            description=t["description"],
            entity_table="customer",
            entity_col="c_custkey",
            target_col=t["target_col"],
            time_col="timestamp",
            timedelta=TIMEDELTA,
            num_eval_timestamps=1,
            sql=t["sql"],
        ).save(folder / "tasks" / name / "manifest.yaml")
    store_labels(folder)


def store_labels(folder: Path) -> None:
    """Generate every task's labels with RelBench's own loader (the manifest SQL) and store
    them as hosted tasks are: ``{split}.parquet``, unmasked, canonically sorted."""
    from relbench.load import RelBenchDataset

    dataset = RelBenchDataset(folder)
    for name in TASKS:
        task = dataset.load_task(name, regenerate=True)
        db = task.get_db(upto_test_timestamp=False)  # built once; each split cuts it as RelBench does
        for split in SPLITS:
            df = task.get_table(split, mask_input_cols=False, db=db).df.reset_index(drop=True)
            # one resolution for every split: under pandas 3 the seed times RelBench makes take
            # the unit of their endpoints, so train's (ending at the db's first time) come out
            # datetime64[ns] and val/test's (from the manifest's dates) datetime64[us]
            df[task.time_col] = df[task.time_col].astype("datetime64[ns]")
            df.to_parquet(folder / "tasks" / name / f"{split}.parquet", index=False)


def _check_dates(orders: pl.DataFrame) -> None:
    """The fixed timestamps only fit TPC-H's order dates (1992-01-01..1998-08-02)."""
    first, last = orders["o_orderdate"].min(), orders["o_orderdate"].max()
    test_end = date.fromisoformat(TEST_TIMESTAMP) + timedelta(days=WINDOW_DAYS)
    if not (isinstance(first, date) and isinstance(last, date)) or first > date(1992, 1, 31) or last <= test_end:
        raise ValueError(
            f"TPC-H order dates {first!s}..{last!s} do not cover the rel-tpch windows (to {test_end}); "
            "regenerate the TPC-H tables with tpchgen-cli."
        )


def summary(folder: Path) -> list[str]:
    """One line per task and split from the stored labels: rows, seed times, label rate or mean."""
    lines = []
    for name, t in TASKS.items():
        for split in SPLITS:
            df = pl.read_parquet(folder / "tasks" / name / f"{split}.parquet")
            seeds = df["timestamp"].unique().sort()
            target = df[t["target_col"]].cast(pl.Float64)
            mean = float(cast(float, target.mean()))
            label = (
                f"positive rate {mean:.3f}"
                if t["task_type"] == "binary_classification"
                else f"mean {mean:,.0f}, zero {float(cast(float, (target == 0).mean())):.3f}"
            )
            days = seeds.dt.strftime("%Y-%m-%d").to_list()
            when = days[0] if len(days) == 1 else f"{days[0]}..{days[-1]}"
            lines.append(f"{name} {split}: {df.height:,} rows, {seeds.len()} seed time(s) {when}, {label}")
    return lines
