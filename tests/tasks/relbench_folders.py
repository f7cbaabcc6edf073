"""Small RelBench folders the tests write themselves, read and scored by relbench's real classes.

``social(folder)``: users (no time column), posts (by users, timed), likes (on posts, timed, no
primary key): a root, a branch and a nested branch. Two forecast tasks with manifest SQL whose
labels are stored by relbench itself (``load_task(..., regenerate=True)``): ``user-posts``
(binary: does the user post in the next 30 days) and ``user-score`` (regression: the score of
those posts).

``planted(folder)``: a leakage probe. Every user appears at exactly one seed time, with a coin-flip
label, and one row of ``signals`` one day *after* that seed time carries the label as a number:
a model that sees it predicts perfectly; one that sees only rows up to the seed time sees
nothing about the label.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd

VAL = "2021-01-01"
TEST = "2021-04-01"
WINDOW = "30 days"

# the next window's posts of every user who posted before the seed time, aggregated by {label}
WINDOW_SQL = """
SELECT t.timestamp, u.user_id, {label}
FROM timestamps t
CROSS JOIN users u
LEFT JOIN posts p
  ON p.user_id = u.user_id AND p.t > t.timestamp AND p.t <= t.timestamp + INTERVAL '{{timedelta}}'
WHERE EXISTS (SELECT 1 FROM posts q WHERE q.user_id = u.user_id AND q.t <= t.timestamp)
GROUP BY t.timestamp, u.user_id
"""
POSTS_SQL = WINDOW_SQL.format(label="CAST(COUNT(p.post_id) > 0 AS INTEGER) AS posts_next")
SCORE_SQL = WINDOW_SQL.format(label="COALESCE(SUM(p.score), 0.0) AS score_next")


def _manifest(folder: Path, tables: dict[str, dict], name: str) -> None:
    from relbench.manifest import DatasetManifest, TableSpec

    DatasetManifest(
        name=name,
        val_timestamp=VAL,
        test_timestamp=TEST,
        tables={t: TableSpec(**s) for t, s in tables.items()},
    ).save(folder / "manifest.yaml")


def social(folder: Path, users: int = 60, posts: int = 1500, seed: int = 0) -> Path:
    """The social folder (module docstring); returns ``folder``."""
    from relbench.load import RelBenchDataset
    from relbench.manifest import TaskManifest

    rng = np.random.default_rng(seed)
    (folder / "db").mkdir(parents=True)
    start = pd.Timestamp("2020-01-01")
    # users post at their own rate, so the past predicts the future
    rate = rng.uniform(0.05, 1.0, users)
    owner = rng.choice(users, posts, p=rate / rate.sum())
    t = np.sort(start + pd.to_timedelta(rng.integers(0, 520 * 24, posts), unit="h"))
    pd.DataFrame(
        {
            "user_id": np.arange(users),
            "age": rng.integers(18, 80, users),
            "plan": rng.choice(["free", "pro", None], users),
        }
    ).to_parquet(folder / "db" / "users.parquet")
    pd.DataFrame(
        {
            "post_id": np.arange(posts),
            "user_id": owner,
            "t": t,
            "score": rng.normal(3, 1, posts).round(2),
            "topic": rng.choice(["a", "b", "c"], posts),
        }
    ).to_parquet(folder / "db" / "posts.parquet")
    likes = posts * 2
    on = rng.integers(0, posts, likes)
    pd.DataFrame(
        {
            "post_id": on,
            "t": t[on] + pd.to_timedelta(rng.integers(0, 20 * 24, likes), unit="h"),
            "weight": rng.uniform(0, 1, likes),
        }
    ).to_parquet(folder / "db" / "likes.parquet")
    _manifest(
        folder,
        {
            "users": {"pkey": "user_id"},
            "posts": {"pkey": "post_id", "time_col": "t", "fkeys": {"user_id": "users"}},
            "likes": {"time_col": "t", "fkeys": {"post_id": "posts"}},
        },
        "social",
    )
    for name, kind, target, sql in (
        ("user-posts", "binary_classification", "posts_next", POSTS_SQL),
        ("user-score", "regression", "score_next", SCORE_SQL),
    ):
        TaskManifest(
            name=name,
            kind="forecast",
            task_type=kind,
            entity_table="users",
            entity_col="user_id",
            target_col=target,
            time_col="timestamp",
            timedelta=WINDOW,
            sql=sql,
        ).save(folder / "tasks" / name / "manifest.yaml")
        task = RelBenchDataset(folder).load_task(name, regenerate=True)
        for split in ("train", "val", "test"):
            task.get_table(split, mask_input_cols=False).df.to_parquet(folder / "tasks" / name / f"{split}.parquet")
    return folder


def planted(folder: Path, users: int = 600, seed: int = 0) -> Path:
    """The leakage probe (module docstring); returns ``folder``."""
    from relbench.manifest import TaskManifest

    rng = np.random.default_rng(seed)
    (folder / "db").mkdir(parents=True)
    split = np.array(["train"] * (users * 3 // 5) + ["val"] * (users // 5) + ["test"] * (users - users * 4 // 5))
    train_days = rng.integers(0, 300, users)
    seeds = np.where(
        split == "train",
        (pd.Timestamp("2020-01-01") + pd.to_timedelta(train_days, unit="D")).values,
        np.where(split == "val", np.datetime64(VAL, "ns"), np.datetime64(TEST, "ns")),
    ).astype("datetime64[ns]")
    label = rng.integers(0, 2, users)
    pd.DataFrame({"user_id": np.arange(users), "age": rng.integers(18, 80, users)}).to_parquet(
        folder / "db" / "users.parquet"
    )
    # noise before every seed, and the label one day after it
    noise = users * 3
    who = rng.integers(0, users, noise)
    before = seeds[who] - pd.to_timedelta(rng.integers(1, 200, noise), unit="D").values
    signal_t = np.concatenate([before, seeds + np.timedelta64(1, "D")])
    order = np.argsort(signal_t, kind="stable")
    pd.DataFrame(
        {
            "user_id": np.concatenate([who, np.arange(users)])[order],
            "t": signal_t[order],
            "value": np.concatenate([rng.integers(0, 2, noise), label]).astype(float)[order],
        }
    ).to_parquet(folder / "db" / "signals.parquet")
    _manifest(
        folder,
        {"users": {"pkey": "user_id"}, "signals": {"time_col": "t", "fkeys": {"user_id": "users"}}},
        "planted",
    )
    TaskManifest(
        name="coin",
        kind="external",
        task_type="binary_classification",
        entity_table="users",
        entity_col="user_id",
        target_col="label",
        time_col="timestamp",
        timedelta="1 days",
    ).save(folder / "tasks" / "coin" / "manifest.yaml")
    rows = pd.DataFrame({"timestamp": seeds, "user_id": np.arange(users), "label": label})
    for s in ("train", "val", "test"):
        rows[split == s].reset_index(drop=True).to_parquet(folder / "tasks" / "coin" / f"{s}.parquet")
    return folder


def spec_file(folder: Path, dataset: Path, task: str, name: str = "rb", extra: str = "") -> Path:
    """A spec holding only ``name`` and ``source.relbench`` (plus ``extra`` YAML lines)."""
    path = folder / f"{name}.yaml"
    path.write_text(f"name: {name}\nsource:\n  relbench: {{path: {dataset}, task: {task}}}\n{extra}")
    return path


def day(s: str) -> dt.datetime:
    return dt.datetime.fromisoformat(s)
