"""Property tests of the run contract (issue 9): for random nested schemas and data (nulls,
empty branches, duplicate keys, non-finite values, unicode and spaces in names and paths,
mixed key types) and random spec settings, a run either

- finishes with a verdict and counts that match the data (root rows, rows written, orphan
  rows, parents without rows, non-finite values), or
- stops with a ``UserError`` (the CLI's exit 2) whose message names the cause,

and never raises anything else, never leaves an MLflow run RUNNING and never leaves a
file in the output folder of a run that did not finish.

The flow runs in-process under the session's Prefect harness (one start-up for all
examples). Example counts are bounded for CI; failures hypothesis found are kept below as
``@example`` regression cases.

Named ``test_benchmark_properties.py`` (tests/README.md): test_benchmark.py holds the flow's main
end-to-end test; this file is one aspect of a benchmark-flow run.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlflow.tracking import MlflowClient

from tasks.runtime.errors import UserError

_EXAMPLE = itertools.count()
NAMES = st.sampled_from(["amount", "prix €", "naïve col", "col with spaces", "数量", "x"])
FLOATS = st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False), st.sampled_from([math.nan, math.inf, -math.inf]))


@dataclass
class World:
    spec: dict
    tables: dict[str, pa.Table]
    n_root_unique: int
    duplicates: bool
    has_inf: bool
    key_mismatch: bool


@st.composite
def worlds(draw) -> World:
    n = draw(st.integers(1, 25))
    str_keys = draw(st.booleans())
    keys = list(range(1, n + 1))
    dup = draw(st.booleans()) and draw(st.booleans())  # ~1 in 4
    if dup:
        keys.append(keys[0])
    key_arr = pa.array([f"k{k}" for k in keys]) if str_keys else pa.array(keys, pa.int64())
    num_name = draw(NAMES)
    nums = draw(st.lists(FLOATS, min_size=len(keys), max_size=len(keys)))
    classes = draw(st.integers(1, 3))
    labels = draw(
        st.lists(
            st.one_of(st.none(), st.integers(0, classes - 1).map(lambda c: f"c{c}")),
            min_size=len(keys),
            max_size=len(keys),
        )
    )
    root = pa.table(
        {
            "id key": key_arr,
            num_name: pa.array(nums, pa.float64()),
            "seg": pa.array([f"s{i % 3}" for i in range(len(keys))]),
            "label": pa.array(labels, pa.string()),
        }
    )
    # one branch under the root, maybe a nested one under it
    per_parent = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    parent_ids = [k for k, m in zip(range(1, n + 1), per_parent, strict=True) for _ in range(m)]
    orphans = draw(st.integers(0, 3))
    parent_ids += [10_000 + i for i in range(orphans)]
    mismatch = draw(st.booleans()) and draw(st.booleans())
    as_str = str_keys != mismatch  # the branch's key type; differs from the root's on mismatch
    pk = pa.array([f"k{k}" for k in parent_ids]) if as_str else pa.array(parent_ids, pa.int64())
    m = len(parent_ids)
    child_vals = draw(st.lists(FLOATS, min_size=m, max_size=m))
    child = pa.table(
        {
            "parent id": pk,
            "child key": pa.array(range(m), pa.int64()),
            "pos": pa.array(range(m), pa.int64()),
            "v": pa.array(child_vals, pa.float64()),
            "flag": pa.array([["A", "B", None][i % 3] for i in range(m)], pa.string()),
        }
    )
    nested = draw(st.booleans())
    branch = {
        "name": "kids",
        "table": "kids",
        "parent_key": "parent id",
        "key": "child key",
        "order_by": {"column": "pos", "descending": draw(st.booleans())},
        "max_length": draw(st.integers(1, 8)),
        "overflow": draw(st.sampled_from(["keep_first", "keep_last", "sample"])),
        "reduce": draw(st.sampled_from(["mean", "attention"])),
        "columns": {"v": "numeric", "flag": "category"},
        "branches": [],
    }
    tables = {"roots": root, "kids": child}
    if nested and m:
        g = draw(st.lists(st.integers(0, 3), min_size=m, max_size=m))
        gp = [i for i, c in enumerate(g) for _ in range(c)]
        tables["grand"] = pa.table({"kid": pa.array(gp, pa.int64()), "w": pa.array([float(i) for i in range(len(gp))])})
        branch["branches"] = [
            {
                "name": "grand",
                "table": "grand",
                "parent_key": "kid",
                "max_length": draw(st.integers(1, 4)),
                "columns": {"w": "numeric"},
            }
        ]
    spec = {
        "name": "prop",
        "source": {"tables": {t: f"dáta dir/{t} file.parquet" for t in tables}},
        "schema": {
            "root": {"table": "roots", "key": "id key", "columns": {num_name: "numeric", "seg": "category"}},
            "branches": [branch],
        },
        "task": {"target": "label", "kind": "category", "validation_fraction": draw(st.sampled_from([0.2, 0.5]))},
        "model": {"d_model": 8, "layers": 1, "heads": 2},
        "run": {
            "mode": draw(st.sampled_from(["train+predict", "predict"])),
            "batch_size": draw(st.integers(1, 16)),
            "epochs": 1,
            "warmup_batches": 0,
            "chunk_rows": draw(st.integers(1, 30)),
            "device": "cpu",
            "min_steady_batches": 1,
            "min_steady_seconds": 0.000001,
            "system_metrics_interval_s": 0,
            "output_dir": "out puts",
        },
    }
    has_inf = any(v is not None and math.isinf(v) for v in nums + child_vals)
    return World(spec, tables, n, dup, has_inf, mismatch)


def _expected_counts(w: World) -> dict[str, float]:
    roots = set(w.tables["roots"]["id key"].to_pylist())
    parents = w.tables["kids"]["parent id"].to_pylist()
    nan = sum(1 for v in w.tables["roots"].column(1).to_pylist() if v is not None and math.isnan(v))
    out = {
        "data.root_rows": float(len(roots)),
        "data.rows_written": float(len(roots)),
        "data.orphan_rows.kids": float(sum(p not in roots for p in parents)),
        "data.roots_without_rows.kids": float(len(roots - set(parents))),
    }
    num_name = w.tables["roots"].column_names[1]
    out[f"data.non_finite.roots.{num_name}"] = float(nan)
    return out


@pytest.mark.slow
@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(world=worlds())
def test_a_run_finishes_with_matching_counts_or_names_its_cause(world, prefect_harness, tmp_path, monkeypatch):
    from flows.benchmark import benchmark

    folder = tmp_path / f"example {next(_EXAMPLE)}"
    data = folder / "dáta dir"
    data.mkdir(parents=True)
    for name, table in world.tables.items():
        pq.write_table(table, data / f"{name} file.parquet")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    monkeypatch.chdir(folder)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    try:
        summary = benchmark(spec=world.spec, spec_dir=str(folder))
    except UserError as err:
        msg = str(err)
        assert any(s in msg for s in ("Table", "Column", "Branch", "task.target", "run.", "Invalid")), msg
        if world.duplicates:
            assert "duplicate root key" in msg
        summary = None
    else:
        assert not world.duplicates and not world.has_inf and not world.key_mismatch
        assert summary["validity"] in ("VALID", "INVALID")
        m = summary["metrics"]
        for key, value in _expected_counts(world).items():
            assert m[key] == value, (key, m[key], value)
    client = MlflowClient(tracking_uri=uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(exps) if exps else []
    assert not [r for r in runs if r.info.status == "RUNNING"]
    left = sorted(p.name for p in (folder / "out puts").rglob("*")) if (folder / "out puts").exists() else []
    if summary is None:
        assert left == [], left
    else:
        assert not [n for n in left if ".tmp-" in n], left
