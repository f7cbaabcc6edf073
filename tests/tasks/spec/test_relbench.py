"""``source.relbench``: a spec holding only ``name`` and the folder is complete (tasks/spec/relbench.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tasks.runtime.errors import UserError
from tasks.spec import load_spec
from tasks.spec.relbench import DEFAULT_MAX_LENGTH, NESTED_MAX_LENGTH, SEED_KEY, SPLIT
from tests.tasks.relbench_folders import social, spec_file


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return social(tmp_path_factory.mktemp("rb") / "social")


def test_schema_and_task_are_derived_from_the_foreign_key_graph(folder, tmp_path):
    spec = load_spec(spec_file(tmp_path, folder, "user-posts"))
    root = spec.schema_.root
    assert (root.table, root.key, root.entity, root.seed_time, root.split) == (
        "user-posts",
        SEED_KEY,
        "user_id",
        "timestamp",
        SPLIT,
    )
    assert root.columns == {"age": "numeric", "plan": "category"}  # user_id is the key: no input
    (posts,) = spec.schema_.branches
    assert (posts.table, posts.parent_key, posts.key, posts.time) == ("posts", "user_id", "post_id", "t")
    assert posts.order_by is not None and posts.order_by.column == "t" and posts.order_by.descending
    assert (posts.max_length, posts.overflow) == (DEFAULT_MAX_LENGTH, "keep_first")  # the most recent
    assert posts.columns == {"t": "timestamp", "score": "numeric", "topic": "category"}
    (likes,) = posts.branches  # one hop down: a table whose foreign key points at the branch table
    assert (likes.table, likes.parent_key, likes.time, likes.max_length) == ("likes", "post_id", "t", NESTED_MAX_LENGTH)
    assert (spec.task.target, spec.task.kind) == ("posts_next", "binary")
    assert load_spec(spec_file(tmp_path, folder, "user-score")).task.kind == "regression"


def test_overrides_address_derived_branches_and_a_written_schema_wins(folder, tmp_path):
    spec = load_spec(spec_file(tmp_path, folder, "user-posts"), ["posts.max_length=3", "likes.max_length=2"])
    assert spec.schema_.branches[0].max_length == 3 and spec.schema_.branches[0].branches[0].max_length == 2
    derived = load_spec(spec_file(tmp_path, folder, "user-posts")).to_dict()
    derived["schema"]["branches"][0]["branches"] = []
    derived["schema"]["branches"][0]["columns"] = {"score": "numeric"}
    path = tmp_path / "written.yaml"
    path.write_text(yaml.safe_dump(derived))
    spec = load_spec(path)
    assert spec.schema_.branches[0].columns == {"score": "numeric"} and not spec.schema_.branches[0].branches


def test_remove_columns_never_become_inputs(tmp_path):
    folder = social(tmp_path / "social")
    manifest = folder / "tasks" / "user-posts" / "manifest.yaml"
    m = yaml.safe_load(manifest.read_text())
    m["remove_columns"] = [["posts", "score"], ["users", "age"]]
    manifest.write_text(yaml.safe_dump(m))
    spec = load_spec(spec_file(tmp_path, folder, "user-posts"))
    assert "age" not in spec.schema_.root.columns and "score" not in spec.schema_.branches[0].columns


@pytest.mark.parametrize(
    ("remove", "named"),
    [
        ("manifest.yaml", "manifest.yaml"),
        ("db/posts.parquet", "posts.parquet"),
        ("tasks/user-posts/manifest.yaml", "user-posts"),
    ],
)
def test_a_missing_file_is_named_before_work(tmp_path, remove, named):
    folder = social(tmp_path / "social")
    (folder / remove).unlink()
    with pytest.raises(UserError, match=named):
        load_spec(spec_file(tmp_path, folder, "user-posts"))


def test_missing_stored_labels_without_sql_are_named(tmp_path):
    folder = social(tmp_path / "social")
    manifest = folder / "tasks" / "user-posts" / "manifest.yaml"
    m = yaml.safe_load(manifest.read_text())
    m["kind"], m.pop("sql")  # an external task: labels only as files
    m["kind"] = "external"
    manifest.write_text(yaml.safe_dump(m))
    (folder / "tasks" / "user-posts" / "val.parquet").unlink()
    with pytest.raises(UserError, match=r"val\.parquet"):
        load_spec(spec_file(tmp_path, folder, "user-posts"))


def test_an_unsupported_task_type_is_refused(tmp_path):
    folder = social(tmp_path / "social")
    manifest = folder / "tasks" / "user-posts" / "manifest.yaml"
    m = yaml.safe_load(manifest.read_text())
    m["task_type"] = "multilabel_classification"
    manifest.write_text(yaml.safe_dump(m))
    with pytest.raises(UserError, match="multilabel_classification"):
        load_spec(spec_file(tmp_path, folder, "user-posts"))


def test_time_columns_relbench_cannot_filter_are_refused_before_work(tmp_path):
    import pandas as pd

    folder = social(tmp_path / "social")
    posts = pd.read_parquet(folder / "db" / "posts.parquet")
    posts["t"] = posts["t"].dt.tz_localize("UTC")  # relbench compares with naive timestamps
    posts.to_parquet(folder / "db" / "posts.parquet")
    with pytest.raises(UserError, match="time zone UTC"):
        load_spec(spec_file(tmp_path, folder, "user-posts"))
    manifest = yaml.safe_load((folder / "manifest.yaml").read_text())
    manifest["tables"]["posts"]["time_col"] = "posted at"  # relbench filters with DataFrame.query
    (folder / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    with pytest.raises(UserError, match="Python identifier"):
        load_spec(spec_file(tmp_path, folder, "user-posts"))
