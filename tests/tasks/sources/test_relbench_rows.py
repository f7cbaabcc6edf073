"""The task's rows as the root table (tasks/sources/relbench.py): relbench's rows, keyed by
(entity, seed time), the entity's columns as of the seed time, written once."""

from __future__ import annotations

import datetime as dt

import pandas as pd
import polars as pl
import yaml

from tasks.sources import relbench as rows_module
from tasks.sources.open import open_sources
from tasks.spec import load_spec
from tasks.spec.relbench import SEED_KEY, SPLIT
from tests.tasks.relbench_folders import social, spec_file


def test_rows_are_relbenchs_keyed_by_entity_and_seed_time_and_the_build_seconds_persist(tmp_path, monkeypatch):
    monkeypatch.setenv("RELFLOW_DATA_DIR", str(tmp_path / "data"))
    folder = social(tmp_path / "social", users=40, posts=600)
    spec = load_spec(spec_file(tmp_path, folder, "user-posts"))
    ticks = iter([10.0, 12.5])  # a scripted clock: the build takes exactly 2.5 s
    monkeypatch.setattr(rows_module, "wall_clock", lambda: next(ticks))
    first = rows_module.task_rows(spec, rows_module.folder_of(spec, tmp_path), open_sources(spec, tmp_path)["users"])
    again = rows_module.task_rows(spec, rows_module.folder_of(spec, tmp_path), open_sources(spec, tmp_path)["users"])
    assert first.seconds == again.seconds == 2.5  # the reused file reports when it was written
    got = pl.read_parquet(first.table.files[0])
    want = pd.concat(
        [
            pd.read_parquet(folder / "tasks" / "user-posts" / f"{s}.parquet").assign(split=s)
            for s in ("train", "val", "test")
        ]
    )
    assert got.height == len(want)
    assert got[SEED_KEY].is_sorted() and got[SEED_KEY].n_unique() == got.height
    assert sorted(got[SPLIT].to_list()) == sorted(want.split.tolist())
    row = got.filter(pl.col(SEED_KEY) == f"{want.user_id.iloc[0]}@{want.timestamp.iloc[0]:%Y-%m-%dT%H:%M:%S}")
    assert row["posts_next"].item() == want.posts_next.iloc[0]


def test_an_entity_that_appears_after_the_seed_time_has_no_columns_yet(tmp_path, monkeypatch):
    monkeypatch.setenv("RELFLOW_DATA_DIR", str(tmp_path / "data"))
    folder = social(tmp_path / "social", users=40, posts=600)
    users = pd.read_parquet(folder / "db" / "users.parquet")
    users["joined"] = pd.Timestamp("2020-01-01") + pd.to_timedelta(users.user_id * 15, unit="D")  # sorted by key
    users.to_parquet(folder / "db" / "users.parquet")
    manifest = yaml.safe_load((folder / "manifest.yaml").read_text())
    manifest["tables"]["users"]["time_col"] = "joined"
    (folder / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    spec = load_spec(spec_file(tmp_path, folder, "user-posts"))
    rows = rows_module.task_rows(spec, rows_module.folder_of(spec, tmp_path), open_sources(spec, tmp_path)["users"])
    got = pl.read_parquet(rows.table.files[0]).join(
        pl.from_pandas(users[["user_id", "joined", "age"]]).rename({"age": "true_age"}), on="user_id"
    )
    seed = pl.col("timestamp").cast(pl.Datetime("us"))
    late = got.filter(pl.col("joined").cast(pl.Datetime("us")) > seed)
    known = got.filter(pl.col("joined").cast(pl.Datetime("us")) <= seed)
    assert late.height > 0 and known.height > 0
    assert late["age"].null_count() == late.height  # not known at the seed time
    assert (known["age"] == known["true_age"]).all()
    assert dt.datetime(2020, 1, 1) <= got["joined"].min()
