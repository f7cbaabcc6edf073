"""tasks/libraries/relational_transformers/graph_contexts.py: relational-transformers-utils 0.1.0's
contexts (model.rt.context.builder rt_utils) on tiny hand-made tables with exact answers.

The shop graph: one user (age 30) with three orders, the third after the seed time S and carrying
the label (amount 999); the task's rows of that user at S - 20 days (label known at S - 10 days),
S - 5 days (its window ends after S), S (the target) and S + 10 days (planted: its label is the
answer). The window (timedelta) is 10 days.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from relational_transformers.constants import SEM_BOOLEAN, SEM_DATETIME, SEM_NUMBER, SEM_TEXT
from relational_transformers_utils import ContextTruncated, TemporalBound

from tasks.libraries.relational_transformers.contexts import Stats, collate, encode
from tasks.libraries.relational_transformers.graph_contexts import (
    AssemblyFigures,
    GraphStore,
    GraphTables,
    TableSpec,
    TextCache,
    policy_of,
)
from tasks.runtime.errors import UserError
from tasks.spec import Spec

S = dt.datetime(2021, 3, 1)
DAY = dt.timedelta(days=1)
WINDOW = 10 * 86400.0


def _spec(**context: Any) -> Spec:
    return Spec.model_validate(
        {
            "name": "shop",
            "source": {"tables": {"users": "u.parquet", "orders": "o.parquet"}},
            "schema": {"root": {"table": "users", "key": "user_id", "columns": {"age": "numeric"}}},
            "task": {"target": "label", "kind": "binary"},
            "model": {"library": "relational_transformers", "rt": {"context": {"builder": "rt_utils", **context}}},
        }
    )


def _graph(
    *,
    user_time: dt.datetime | None = None,
    tasks: list[tuple[int, dt.datetime, int | None]] | None = None,
    orders: list[tuple[int, int, dt.datetime, float]] | None = None,
) -> GraphTables:
    # users 2 and 3 are linked to nothing: the graph keeps more rows than any context emits (the
    # library raises ContextTruncated when a context emits every row: see that test)
    users = {"user_id": pa.array([0, 1, 2, 3]), "age": pa.array([30.0, 50.0, 60.0, 70.0])}
    user_cols = {"age": "numeric"}
    if user_time is not None:
        users["signup"] = pa.array([user_time, *[S - 400 * DAY] * 3], pa.timestamp("us"))
        user_cols["signup"] = "timestamp"
    orders = orders or [(10, 0, S - 30 * DAY, 5.0), (11, 0, S - 2 * DAY, 7.0), (12, 0, S + DAY, 999.0)]
    tasks = tasks or [(0, S - 20 * DAY, 0), (0, S - 5 * DAY, 1), (0, S, 1), (0, S + 10 * DAY, 1)]
    keys = [f"{u}@{t.isoformat()}" for u, t, _ in tasks]
    task_rows = pa.table(
        {
            "seed_key": pa.array(keys),
            "user_id": pa.array([u for u, _, _ in tasks]),
            "timestamp": pa.array([t for _, t, _ in tasks], pa.timestamp("us")),
            "label": pa.array([v for _, _, v in tasks], pa.int64()),
        }
    ).sort_by("seed_key")
    return GraphTables(
        entity="users",
        task="buys",
        entity_col="user_id",
        seed_time="timestamp",
        target="label",
        key="seed_key",
        window_seconds=WINDOW,
        train_bound=(S - 20 * DAY).replace(tzinfo=dt.UTC).timestamp(),
        specs={
            "users": TableSpec("user_id", "signup" if user_time else None, user_cols, {}),
            "orders": TableSpec("order_id", "t", {"t": "timestamp", "amount": "numeric"}, {"user_id": "users"}),
        },
        tables={
            "users": pa.table(users),
            "orders": pa.table(
                {
                    "order_id": pa.array([o for o, _, _, _ in orders]),
                    "user_id": pa.array([u for _, u, _, _ in orders]),
                    "t": pa.array([t for _, _, t, _ in orders], pa.timestamp("us")),
                    "amount": pa.array([a for _, _, _, a in orders]),
                }
            ),
        },
        task_rows=task_rows,
    )


def _chunk(keys: list[str], labels: list[int | None] | None = None) -> pa.Table:
    return pa.table(
        {
            "seed_key": pa.array(keys),
            "label": pa.array(labels or [None] * len(keys), pa.int64()),
            "__train": pa.array([False] * len(keys)),
        }
    )


def _target_key(u: int = 0, t: dt.datetime = S) -> str:
    return f"{u}@{t.isoformat()}"


STATS = Stats(scales={})


def _cells_by_table(store: GraphStore, contexts: Any) -> dict[str, list[tuple[str, float]]]:
    """(column, value) of every cell by table name: numbers and booleans by value, times as 0,
    the target as -1."""
    out: dict[str, list[tuple[str, float]]] = {}
    names = contexts.column_names.to_pylist()
    for i in range(len(contexts.node)):
        table = store.order[int(contexts.table[i])]
        column = names[int(contexts.column[i])].split(" of ")[0]
        sem = int(contexts.sem[i])
        value = {
            SEM_NUMBER: float(contexts.number[i]),
            SEM_BOOLEAN: float(contexts.boolean[i]),
            SEM_DATETIME: 0.0,
        }.get(sem, -2.0)
        if contexts.is_target[i]:
            value = -1.0  # the masked query
        out.setdefault(table, []).append((column, value))
    return {k: sorted(v) for k, v in out.items()}


def test_one_context_holds_exactly_the_rows_up_to_its_seed_time():
    store = GraphStore(_spec(), _graph())
    contexts = store.contexts(_chunk([_target_key()]), STATS)
    assert contexts.count == 1
    # target (masked) + its seed time; the user's age; two orders before S (time, amount); the
    # S - 20 days row (time, label 0: its window closed at S - 10 days); the S - 5 days row's
    # time only (its window ends after S). Never order 12 (after S) nor the S + 10 days row.
    assert _cells_by_table(store, contexts) == {
        "buys": [("label", -1.0), ("label", 0.0), ("timestamp", 0.0), ("timestamp", 0.0), ("timestamp", 0.0)],
        "orders": [("amount", 5.0), ("amount", 7.0), ("t", 0.0), ("t", 0.0)],
        "users": [("age", 30.0)],
    }
    assert int(contexts.is_target.sum()) == 1
    assert int(contexts.sem[contexts.is_target][0]) == SEM_BOOLEAN
    assert 999.0 not in contexts.number.tolist()
    base = store.store.base
    assert base["orders"] + 2 not in contexts.node.tolist()  # order 12
    assert store.figures.label_cells_withheld == 1
    assert store.figures.future_cells_dropped == 0
    # each order cell's parent is the user's node
    order_cells = contexts.table == store.order.index("orders")
    assert set(contexts.parents[order_cells][:, 0].tolist()) == {base["users"]}
    assert (contexts.parents[order_cells][:, 1:] == -1).all()


def test_a_planted_row_after_the_seed_time_never_enters_any_context():
    """The label of the S target is planted after S twice: order 12 (amount 999) and the
    S + 10 days task row. Contexts for every target at or before S hold neither."""
    store = GraphStore(_spec(num_walks=500), _graph())
    keys = [_target_key(0, S - 20 * DAY), _target_key(0, S - 5 * DAY), _target_key()]
    contexts = store.contexts(_chunk(keys), STATS)
    planted = {store.store.base["orders"] + 2, store.store.base["buys"] + 3}
    assert planted.isdisjoint(contexts.node.tolist())
    # and no cell of any context comes from a row after that context's seed time
    anchors = np.repeat(store.task_ts[store.targets(pa.array(keys))], contexts.lengths)
    ts = store.store.node_ts[contexts.node]
    assert not (ts > anchors).any()


def test_the_library_admits_a_parent_after_the_seed_time_and_the_builder_drops_its_cells():
    """Finding: the library's expansion admits a row's foreign-key parents whatever their time:
    a user who signed up after S is in S's context as the target's parent."""
    store = GraphStore(_spec(), _graph(user_time=S + 3 * DAY))
    user = store.store.base["users"]
    res = store.traversal.traverse(
        store.schema, None, "users", 0, TemporalBound.at_or_before(S), store.policy, query=store.adapter
    )
    assert user in [n for _, n in res.node_ids]  # the library: the future row is in
    contexts = store.contexts(_chunk([_target_key()]), STATS)
    cells = _cells_by_table(store, contexts)
    assert "users" not in cells  # the builder: its two cells (age, signup) are not
    assert store.figures.future_cells_dropped == 2
    assert user in contexts.parents[:, 0].tolist()  # still the parent its rows point at


def test_a_same_time_peer_label_is_withheld():
    """Another user's row at the same seed time S carries a label about (S, S + 10 days]: the
    walks reach it (its label is not null and its time is not after S); its label gives no cell."""
    tasks = [(0, S, 1), (1, S, 1), (1, S - 30 * DAY, 0)]
    orders = [(10, 0, S - 30 * DAY, 5.0), (11, 1, S - 30 * DAY, 6.0)]
    g = _graph(tasks=tasks, orders=orders)
    store = GraphStore(_spec(num_walks=2000, walk_length=6), g)
    contexts = store.contexts(_chunk([_target_key()]), STATS)
    peer = store.store.base["buys"] + int(store.targets(pa.array([_target_key(1)]))[0])
    assert peer in contexts.node.tolist()  # the library emitted the same-time peer
    label_col = contexts.column_names.to_pylist().index("label of buys")
    peer_labels = (contexts.node == peer) & (contexts.column == label_col)
    assert not peer_labels.any()
    assert store.figures.label_cells_withheld == 1
    # the older row of user 1 (window closed before S) keeps its label 0
    old = store.store.base["buys"] + int(store.targets(pa.array([_target_key(1, S - 30 * DAY)]))[0])
    old_label = (contexts.node == old) & (contexts.column == label_col)
    assert contexts.boolean[old_label].tolist() == [0.0]


def test_max_context_cells_is_exceeded_by_the_row_that_crosses_it():
    """Finding: the budget is checked after a row is added, so the last row's cells overshoot:
    max_context_cells 4 gives 5 cells (target row 2, user 1, first order 2)."""
    store = GraphStore(_spec(max_context_cells=4, num_walks=0), _graph())
    contexts = store.contexts(_chunk([_target_key()]), STATS)
    assert contexts.lengths.tolist() == [5]
    assert store.figures.budget_full == 1


def test_context_truncated_exits_2_naming_the_budget_key():
    """Finding: the library sizes its node buffer as the store's node count, so a context that
    emits every row of a small graph raises ContextTruncated though nothing was cut."""
    g = _graph(tasks=[(0, S, 1)], orders=[(10, 0, S - DAY, 5.0)])
    g = GraphTables(**{**g.__dict__, "tables": {**g.tables, "users": g.tables["users"].slice(0, 1)}})
    store = GraphStore(_spec(), g)
    assert store.store.n_nodes == 3
    with pytest.raises(ContextTruncated):
        store.traversal.traverse(
            store.schema, None, "users", 0, TemporalBound.at_or_before(S), store.policy, query=store.adapter
        )
    with pytest.raises(UserError, match=r"model\.rt\.context\.max_context_cells") as err:
        store.contexts(_chunk([_target_key()]), STATS)
    assert err.value.exit_code == 2


def test_the_budget_keys_reach_the_library_policy():
    spec = _spec(
        max_context_cells=64, local_context_cells=16, bfs_width=3, num_walks=7, walk_length=2, prefer_latest=False
    )
    p = policy_of(spec)
    assert (p.max_context_cells, p.local_context_cells, p.bfs_width, p.num_walks, p.walk_length) == (64, 16, 3, 7, 2)
    assert p.prefer_latest is False
    assert p.seed == spec.run.seed  # unset: the run's seed
    assert policy_of(_spec(seed=11)).seed == 11


def test_the_same_seed_gives_the_same_contexts():
    tasks = [(u, S, 1) for u in (0, 1)] + [(u, S - 30 * DAY, u % 2) for u in (0, 1)]
    orders = [(10 + i, i % 2, S - (40 + i) * DAY, float(i)) for i in range(12)]
    a = GraphStore(_spec(max_context_cells=12, num_walks=300, bfs_width=2), _graph(tasks=tasks, orders=orders))
    b = GraphStore(_spec(max_context_cells=12, num_walks=300, bfs_width=2), _graph(tasks=tasks, orders=orders))
    key = [_target_key()]
    ca, cb = a.contexts(_chunk(key), STATS), b.contexts(_chunk(key), STATS)
    assert ca.node.tolist() == cb.node.tolist()


def test_text_goes_through_the_cached_encoder_and_counts_hits():
    cache = TextCache()
    first = cache(pa.array(["a", "b", "c"]))
    again = cache(pa.array(["c", "d"]))
    assert (cache.hits, cache.misses) == (1, 4)
    np.testing.assert_array_equal(first[2], again[0])
    assert first.shape == (3, 384)


def test_contexts_collate_into_a_relational_batch_with_boolean_labels():
    store = GraphStore(_spec(), _graph())
    contexts = store.contexts(_chunk([_target_key()]), STATS)
    batch = collate(contexts, encode(contexts, TextCache()), [0])
    label_col = contexts.column_names.to_pylist().index("label of buys")
    peer = (contexts.column == label_col) & ~contexts.is_target
    assert int(batch.is_targets.sum()) == 1
    assert batch.boolean_values[0, np.flatnonzero(peer), 0].tolist() == [0.0]
    assert int((~batch.is_padding).sum()) == len(contexts.node)


def test_figures_name_each_bucket():
    figures = AssemblyFigures()
    store = GraphStore(_spec(), _graph(), figures)
    store.contexts(_chunk([_target_key()]), STATS, predict=True)
    assert figures.contexts == 1 and figures.store_seconds > 0 and figures.assembly_seconds > 0
    assert [c.tolist() for c in figures.cells] == [[10]]


# --- through the harness: a RelBench folder, the chain and the flow ------------------------------

GRAPH = (
    "model: {{library: relational_transformers, d_model: 16, layers: 2, heads: 2,\n"
    "        rt: {{context: {{builder: rt_utils, max_context_cells: {cells}, num_walks: 200, walk_length: 6}}}}}}\n"
)
RUN = (
    "run: {epochs: 1, batch_size: 64, min_steady_batches: 1, min_steady_seconds: 0.001, system_metrics_interval_s: 0}\n"
)


@pytest.mark.slow
def test_the_planted_labels_after_the_seed_time_never_reach_a_graph_context(tmp_path, monkeypatch):
    """tests/tasks/relbench_folders.py ``planted``: each user's label sits in a signals row one day
    after the user's seed time. Over every task row, through the harness's sources and chain, no
    context holds a cell of a row after its seed time, and no planted row is emitted at all."""
    import torch

    from tasks.run.chain import Chain
    from tasks.sources.open import open_sources
    from tasks.spec import load_spec
    from tasks.stages.retrieve import list_root_keys
    from tests.tasks.relbench_folders import planted, spec_file

    monkeypatch.setenv("RELFLOW_DATA_DIR", str(tmp_path / "data"))
    folder = planted(tmp_path / "planted", users=200)
    spec = load_spec(spec_file(tmp_path, folder, "coin", extra=GRAPH.format(cells=48)))
    chain = Chain(spec, open_sources(spec, tmp_path), torch.device("cpu"))
    keys, _ = list_root_keys(spec, chain.sources)
    tz = chain.prepare_untimed(keys)
    side = chain.side
    graph = side.graph
    contexts = tz.inputs.encoding.contexts
    assert contexts.count == 200
    anchors = np.repeat(graph.task_ts[graph.targets(contexts.keys)], contexts.lengths)
    ts = graph.store.node_ts[contexts.node]
    assert not (ts > anchors).any()
    # the planted rows: a user's signal one day after that user's own seed time
    rows = graph.g.task_rows.to_pandas()
    seed_of = dict(zip(rows["user_id"], rows["timestamp"], strict=True))
    signals = graph.g.tables["signals"].to_pandas()
    planted_rows = np.flatnonzero(signals["t"] == signals["user_id"].map(seed_of) + pd.Timedelta(days=1))
    assert len(planted_rows) == 200
    assert not np.isin(graph.store.base["signals"] + planted_rows, contexts.node).any()
    assert side.figures.future_cells_dropped == 0


def _flow(tmp_path, monkeypatch, cells: int):  # -> (summary, run)
    from mlflow.tracking import MlflowClient

    from flows.benchmark import benchmark
    from tasks.spec import load_spec
    from tests.tasks.relbench_folders import social, spec_file

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("RELFLOW_DATA_DIR", str(tmp_path / "data"))
    folder = social(tmp_path / "social", users=40, posts=600)
    path = spec_file(tmp_path, folder, "user-posts", name="rb-graph", extra=GRAPH.format(cells=cells) + RUN)
    return benchmark, load_spec(path), MlflowClient(tracking_uri=uri)


@pytest.mark.slow
def test_a_run_with_the_rt_utils_builder_logs_its_figures(prefect_harness, tmp_path, monkeypatch):
    benchmark, spec, client = _flow(tmp_path, monkeypatch, cells=48)
    summary = benchmark(spec=spec.to_dict(), spec_dir=str(tmp_path))
    run = client.get_run(summary["run_id"])
    assert run.info.status == "FINISHED"
    m, params, tags = run.data.metrics, run.data.params, run.data.tags
    assert params["model.rt.context.builder"] == "rt_utils"
    assert params["model.rt.context.max_context_cells"] == "48"
    assert tags["relflow.library_context_builder"].startswith("rt_utils (relational-transformers-utils 0.1.0")
    # the budget (overshot by at most the last row's cells: users 2, posts 4, likes 2)
    assert 1 < m["rt.context.cells_mean"] <= m["rt.context.cells_max"] <= 48 + 4
    # every pass re-encodes the column names and values: later calls hit the cache
    assert m["encode.text_cache_hits"] > 0 and m["encode.text_cache_misses"] > 0
    assert m["rt.context.contexts"] >= m["data.rows_predicted"]
    assert m["rt.context.assembly_seconds"] > 0 and m["rt.context.store_seconds"] > 0
    # the assembly is the encode stage's work: its predict seconds hold that pass's share
    assert m["stage.encode.predict.seconds"] > 0


@pytest.mark.slow
def test_context_truncated_ends_the_run_failed_with_exit_2(prefect_harness, tmp_path, monkeypatch):
    from relational_transformers_utils import ColumnarTraversal

    def truncated(*args: Any, **kwargs: Any) -> Any:
        raise ContextTruncated("context for node 0 filled the emitted-node buffer (3 of 3).")

    monkeypatch.setattr(ColumnarTraversal, "traverse", truncated)
    benchmark, spec, client = _flow(tmp_path, monkeypatch, cells=48)
    with pytest.raises(UserError, match=r"lower model\.rt\.context\.max_context_cells") as err:
        benchmark(spec=spec.to_dict(), spec_dir=str(tmp_path))
    assert err.value.exit_code == 2
    (experiment,) = [e for e in client.search_experiments() if e.name == "rb-graph"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FAILED"  # not left RUNNING


# --- the checks before work -------------------------------------------------------------------------


def _keys(spec: Spec) -> list[str]:
    from tasks.libraries.relational_transformers.checks import refusals

    return [r.key for r in refusals(spec)]


def test_the_spec_schema_is_built_and_a_relbench_folder_in_a_database_is_refused():
    assert _keys(_spec()) == []  # source.tables: the spec's own schema (its own test file, ..._graph_contexts_spec.py)
    raw = _spec().to_dict()
    raw["source"] = {"relbench": {"path": "folder", "task": "buys"}, "database": {"url": "duckdb"}}
    assert _keys(Spec.model_validate(raw)) == ["model.rt.context.builder"]


def test_a_budget_key_under_the_nested_builder_is_refused_and_a_round_trip_is_not():
    nested = _spec(builder="nested", max_context_cells=64)
    assert _keys(nested) == ["model.rt.context.max_context_cells"]
    # a spec dumped and read back sets every key (the flow's to_dict): defaults are no refusal
    plain = Spec.model_validate(_spec(builder="nested").to_dict())
    assert "max_context_cells" in plain.model.rt.context.model_fields_set
    assert not [k for k in _keys(plain) if k.startswith("model.rt.")]


@pytest.mark.parametrize("kind", ["regression", "category"])
def test_earlier_labels_are_the_target_column_in_its_kind(kind):
    """The S - 20 days row's label (window closed) as the target's column: a number normalised
    with the target's training mean and std (regression), the class's string (category)."""
    g = _graph()
    labels = pa.array(["lo", "hi", "hi", "hi"]) if kind == "category" else pa.array([4.0, 9.0, 9.0, 9.0])
    order = pc.sort_indices(g.task_rows, [("seed_key", "ascending")])
    g = dataclasses.replace(g, task_rows=g.task_rows.set_column(3, "label", labels.take(order)))
    raw = _spec().to_dict()
    raw["task"]["kind"] = kind
    spec = Spec.model_validate(raw)
    store = GraphStore(spec, g)
    stats = Stats(scales={}, classes=("hi", "lo"), target_mean=2.0, target_std=4.0)
    contexts = store.contexts(_chunk([_target_key()]), stats)
    label_col = contexts.column_names.to_pylist().index("label of buys")
    peer = (contexts.column == label_col) & ~contexts.is_target
    assert int(peer.sum()) == 1
    if kind == "regression":
        assert contexts.sem[peer].tolist() == [SEM_NUMBER]
        assert contexts.number[peer].tolist() == [pytest.approx((4.0 - 2.0) / 4.0)]
    else:
        assert contexts.sem[peer].tolist() == [SEM_TEXT]
        assert contexts.strings[int(contexts.text[peer][0])].as_py() == "lo"
        assert int(contexts.sem[contexts.is_target][0]) == SEM_TEXT
