"""Which keys requests are drawn from (tasks/run/scenarios/schedule.py): the scored rows."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tasks.run.scenarios.schedule import validation_keys
from tasks.sources.open import open_sources
from tasks.spec import load_spec
from tasks.stages.retrieve import list_root_keys
from tests.tasks.relbench_folders import social, spec_file


def test_a_time_anchored_task_serves_its_test_rows_keyed_by_entity_and_seed_time(tmp_path, monkeypatch):
    monkeypatch.setenv("RELFLOW_DATA_DIR", str(tmp_path / "data"))
    folder = social(tmp_path / "social", users=40, posts=600)
    spec = load_spec(spec_file(tmp_path, folder, "user-posts"))
    sources = open_sources(spec, tmp_path)
    keys, _ = list_root_keys(spec, sources)
    test = pd.read_parquet(folder / "tasks" / "user-posts" / "test.parquet")
    want = sorted(f"{u}@{t:%Y-%m-%dT%H:%M:%S}" for u, t in zip(test.user_id, test.timestamp, strict=True))
    assert len(keys) > len(want)  # every split's rows are root rows
    assert validation_keys(keys, spec, sources).tolist() == want  # requests: the test split only
    assert isinstance(validation_keys(keys, spec, sources), np.ndarray)
