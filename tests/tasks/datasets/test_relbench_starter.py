"""``relbench-init``: a starter RelBench folder from a user's own tables, read by relbench 3.0.2.

Three small tables of the kind users bring: ``users.csv`` (string keys, a signup date),
``products.parquet`` (integer keys with gaps, a decimal price, no time) and ``events.parquet``
(its own id, two foreign keys, a time-zoned timestamp, a key-like column that matches no table).
The starter must infer the keys and time columns, re-index keys as RelBench requires (with a
key map back), and write a folder RelBench's own ``RelBenchDataset`` reads: ``get_db`` (its key
contract check) passes and the example task's splits generate.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from tasks.datasets.relbench_starter import (
    EXAMPLE_TASK,
    TableKeys,
    describe,
    infer_pkey,
    write_starter,
)
from tasks.runtime.errors import UserError

N_EVENTS = 400


def _tables(folder: Path, *, bad_product: bool = False) -> list[Path]:
    rng = np.random.default_rng(0)
    signup = [dt.date(2022, 1, 1) + dt.timedelta(days=int(d)) for d in rng.integers(0, 700, 12)]
    users = pl.DataFrame(
        {"user_id": [f"u{i}" for i in range(12)], "name": [f"n{i}" for i in range(12)], "signup": signup}
    )
    users_csv = folder / "users.csv"
    users.write_csv(users_csv)
    products = pl.DataFrame(
        {"id": [10, 20, 30, 40, 50], "price": [Decimal("1.50"), Decimal("2.25"), Decimal("3"), Decimal("4"), None]},
        schema={"id": pl.Int64, "price": pl.Decimal(10, 2)},
    )
    products_pq = folder / "products.parquet"
    products.write_parquet(products_pq)
    start = dt.datetime(2022, 1, 1, tzinfo=dt.UTC)
    at = [start + dt.timedelta(hours=int(h)) for h in rng.integers(0, 24 * 730, N_EVENTS)]
    product = rng.choice([10, 20, 30, 40], N_EVENTS)
    if bad_product:
        product[0] = 99  # not a product key: product_id is then no foreign key
    events = pl.DataFrame(
        {
            "event_id": rng.permutation(N_EVENTS) * 7 + 3,
            "user_id": [f"u{i}" for i in rng.integers(0, 12, N_EVENTS)],
            "product_id": product,
            "at": pl.Series(at, dtype=pl.Datetime("us", "UTC")),
            "session_key": rng.integers(0, 50, N_EVENTS),
        }
    )
    events_pq = folder / "events.parquet"
    events.write_parquet(events_pq)
    return [users_csv, products_pq, events_pq]


def test_infers_keys_and_time_columns_and_relbench_reads_the_folder(tmp_path):
    from relbench.load import RelBenchDataset

    files = _tables(tmp_path)
    out = tmp_path / "my-data"
    result = write_starter(out, files)
    assert result.tables == {
        "users": TableKeys(pkey="user_id", time_col="signup"),
        "products": TableKeys(pkey="id"),
        "events": TableKeys(pkey="event_id", time_col="at", fkeys={"user_id": "users", "product_id": "products"}),
    }
    assert result.rows == {"users": 12, "products": 5, "events": N_EVENTS}
    assert any("session_key" in n for n in result.notes)  # key-like, matches nothing: the user checks it
    text = "\n".join(describe(result))
    assert "events (400 rows): pkey event_id, time_col at, fkeys user_id -> users, product_id -> products" in text

    ds = RelBenchDataset(out)
    assert ds.manifest.name == "my-data"
    full = ds.get_db(upto_test_timestamp=False)  # RelBench's key-contract check passes ...
    cut = ds.get_db()  # ... also after the cut at test_timestamp (tables with a time column are sorted)
    assert len(cut.table_dict["events"]) < N_EVENTS
    events = full.table_dict["events"].df
    assert events["event_id"].tolist() == list(range(N_EVENTS))
    assert str(events["at"].dtype) == "datetime64[ns]" and events["at"].is_monotonic_increasing
    assert str(full.table_dict["users"].df["signup"].dtype) == "datetime64[ns]"
    assert full.table_dict["products"].df["price"].dtype == np.float64

    # the placeholders: the 70% and 85% quantiles of every time value, floored to the day
    times = np.sort(
        np.concatenate(
            [
                pl.read_csv(files[0], try_parse_dates=True)["signup"].cast(pl.Datetime("us")).to_numpy(),
                pl.read_parquet(files[2])["at"].dt.replace_time_zone(None).to_numpy(),
            ]
        )
    )
    for stamp, q in ((ds.val_timestamp, 0.70), (ds.test_timestamp, 0.85)):
        assert stamp == np.datetime64(times[int(q * len(times))], "D")

    task = ds.load_task(EXAMPLE_TASK)  # the example task loads and every split generates
    assert (task.entity_table, task.entity_col) == ("products", "id")  # a lasting entity first
    for split in ("train", "val", "test"):
        assert len(task.get_table(split, mask_input_cols=False).df) > 0
    manifest_text = (out / "tasks" / EXAMPLE_TASK / "manifest.yaml").read_text()
    assert manifest_text.startswith("# A STARTER task")


def test_keys_are_reindexed_and_the_key_maps_lead_back_to_the_users_rows(tmp_path):
    files = _tables(tmp_path)
    out = tmp_path / "out"
    write_starter(out, files)
    original = pl.read_parquet(files[2]).with_columns(pl.col("at").dt.replace_time_zone(None).cast(pl.Datetime("ns")))
    db = pl.read_parquet(out / "db" / "events.parquet")
    maps = {t: pl.read_parquet(out / "keymap" / f"{t}.parquet") for t in ("users", "products", "events")}
    assert maps["events"].columns == ["original", "event_id"]
    back = (
        db.join(maps["events"], on="event_id")
        .join(maps["users"].rename({"original": "u"}), on="user_id")
        .join(maps["products"].rename({"original": "p", "id": "product_id"}), on="product_id")
        .select(
            pl.col("original").alias("event_id"),
            pl.col("u").alias("user_id"),
            pl.col("p").alias("product_id"),
            "at",
            "session_key",
        )
        .sort("event_id")
    )
    assert back.equals(original.sort("event_id"))
    assert db["user_id"].dtype == pl.Int64 and db["user_id"].max() < 12


def test_a_name_alone_is_no_foreign_key_when_a_value_is_no_key(tmp_path):
    from relbench.load import RelBenchDataset

    result = write_starter(tmp_path / "out", _tables(tmp_path, bad_product=True))
    assert result.tables["events"].fkeys == {"user_id": "users"}
    assert any("product_id" in n for n in result.notes)
    RelBenchDataset(tmp_path / "out").get_db()


def test_tables_with_no_time_column_get_placeholders_and_no_example_task(tmp_path):
    from relbench.load import RelBenchDataset

    a = tmp_path / "shops.parquet"
    b = tmp_path / "staff.parquet"
    pl.DataFrame({"shop_id": ["x", "y"], "city": ["a", "b"]}).write_parquet(a)
    pl.DataFrame({"staff_id": [5, 6, 7], "shop_id": ["y", "x", "y"]}).write_parquet(b)
    result = write_starter(tmp_path / "out", [a, b], name="shops")
    assert result.tables["staff"] == TableKeys(pkey="staff_id", fkeys={"shop_id": "shops"})
    assert result.example_task is None and not (tmp_path / "out" / "tasks").exists()
    assert any("no table has a date or timestamp column" in n for n in result.notes)
    db = RelBenchDataset(tmp_path / "out").get_db()
    assert db.table_dict["staff"].df["shop_id"].tolist() == [1, 0, 1]


def test_pkey_names_come_before_other_unique_key_columns():
    df = pl.DataFrame({"a_key": [3, 1, 2], "order_id": [9, 8, 7], "note": ["x", "y", "z"]})
    assert infer_pkey("orders", df) == "order_id"
    assert infer_pkey("things", df) == "a_key"
    assert infer_pkey("things", df.with_columns(pl.lit(1).alias("a_key"))) == "order_id"
    assert infer_pkey("things", pl.DataFrame({"id": [1, None]})) is None


def test_bad_input_is_a_user_error_and_leaves_nothing(tmp_path):
    files = _tables(tmp_path)
    with pytest.raises(UserError, match="does not exist"):
        write_starter(tmp_path / "out", [*files, tmp_path / "missing.csv"])
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UserError, match="not Parquet or CSV"):
        write_starter(tmp_path / "out", [tmp_path / "notes.txt"])
    (tmp_path / "sub").mkdir()
    dup = tmp_path / "sub" / "users.csv"
    dup.write_text("user_id\n1\n")
    with pytest.raises(UserError, match="share the name"):
        write_starter(tmp_path / "out", [files[0], dup])
    (tmp_path / "broken.parquet").write_text("not parquet")
    with pytest.raises(UserError, match="could not be read"):
        write_starter(tmp_path / "out", [tmp_path / "broken.parquet"])
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out-")]
    (tmp_path / "out").mkdir()
    with pytest.raises(UserError, match="already exists"):
        write_starter(tmp_path / "out", files)


def test_the_command_prints_what_it_inferred_and_exits_2_on_bad_input(tmp_path, monkeypatch):
    from flows.cli import relbench_init
    from flows.cli.app import app

    # the command takes over SIGTERM/SIGINT; the test session keeps its own handlers
    monkeypatch.setattr(relbench_init, "install_interrupts", lambda message=None: None)

    files = [str(p) for p in _tables(tmp_path)]
    res = CliRunner().invoke(app, ["relbench-init", str(tmp_path / "out"), *files])
    assert res.exit_code == 0, res.output
    assert "users (12 rows): pkey user_id, time_col signup" in res.output
    assert "Check before use" in res.output and (tmp_path / "out" / "manifest.yaml").is_file()
    res = CliRunner().invoke(app, ["relbench-init", str(tmp_path / "out"), *files])
    assert res.exit_code == 2 and "already exists" in res.output


def test_a_time_column_that_is_no_python_name_is_renamed_so_relbench_can_cut_by_time(tmp_path):
    """RelBench 3.0.2 cuts a table with DataFrame.query(f"{time_col} <= @timestamp"): a name
    with a space fails in get_db with a SyntaxError unless the starter renames it."""
    from relbench.load import RelBenchDataset

    things = tmp_path / "things.parquet"
    days = [dt.date(2020, 1, 1) + dt.timedelta(days=30 * i) for i in range(24)]
    pl.DataFrame({"id": list(range(24)), "created at": days}).write_parquet(things)
    result = write_starter(tmp_path / "out", [things])
    assert result.tables["things"] == TableKeys(pkey="id", time_col="created_at")
    assert any("'created at' renamed 'created_at'" in n for n in result.notes)
    db = RelBenchDataset(tmp_path / "out").get_db()
    assert "created_at" in db.table_dict["things"].df.columns
