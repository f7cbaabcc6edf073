"""model.rt.context.builder rt_utils over the spec's own schema (no RelBench folder): the shop
fixture (tests/conftest.py: customers -> orders -> lines) as relational-transformers-utils'
graph, read through the harness's sources (files or DuckDB), every cell counted by hand.

The graph: an entity table (the root keys, no cell), the customers' rows as the task table
(c_balance, c_segment, c_since and the masked churn; with schema.root.seed_time also that
time), orders linked by o_cust, lines by l_order. Customer 1 owns orders 10 (lines 1, 2, 3, 4),
11 (line 1) and 12 (lines 1, 2): 24 cells, target included.
"""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from relational_transformers.constants import SEM_BOOLEAN, SEM_DATETIME, SEM_NUMBER, SEM_TEXT
from relational_transformers_utils import TemporalBound

from tasks.libraries.relational_transformers.checks import refusals
from tasks.run.chain import Chain
from tasks.runtime.errors import UserError
from tasks.sources import databases
from tasks.sources.files import resolve_sources
from tasks.spec import parse_spec
from tasks.stages.retrieve import list_root_keys

OWN_CELLS = 24  # customer 1's own context (module docstring)

# customer 1's context, by hand: (table, column, value); "?" = the masked target
CUSTOMER_1 = sorted(
    [
        ("customers", "churn", "?"),
        ("customers", "c_balance", "10.0"),
        ("customers", "c_segment", "a"),
        ("customers", "c_since", "2020-01-01T00:00:00"),
        *[("orders", "o_date", f"2024-0{m}-01T10:00:00") for m in (1, 2, 3)],
        ("orders", "o_total", "100.5"),
        ("orders", "o_total", "200.0"),  # order 12's total is null: no cell
        *[("orders", "o_status", s) for s in ("open", "done", "open")],
        *[("lines", "l_qty", f"{q:.1f}") for q in (1, 2, 4, 5, 6, 7)],  # line 10/3's quantity is null
        *[("lines", "l_flag", f) for f in "ABABAA"],  # line 10/4's flag is null
    ]
)


def _rt(spec: dict[str, Any], **context: Any) -> dict[str, Any]:
    spec = copy.deepcopy(spec)
    spec["model"] = {
        "library": "relational_transformers",
        "d_model": 8,
        "layers": 1,
        "heads": 2,
        "rt": {"context": {"builder": "rt_utils", **context}},
    }
    return spec


def _prepare(spec_dict: dict[str, Any], sources: Any = None, folder: Path | None = None) -> tuple[Any, Any]:
    """Every root key as one chunk through the harness's chain: (the side, its contexts)."""
    spec = parse_spec(spec_dict)
    chain = Chain(spec, sources if sources is not None else resolve_sources(spec, folder), torch.device("cpu"))
    keys, _ = list_root_keys(spec, chain.sources)
    tz = chain.prepare_untimed(keys)
    return chain.side, tz.inputs.encoding.contexts


def _decoded(side: Any, contexts: Any, k: int) -> list[tuple[str, str, str]]:
    """Context ``k``'s cells as (table, column, value): numbers and times de-normalised with the
    run's statistics, strings as they are, booleans as 0/1, the target as '?'."""
    names = contexts.column_names.to_pylist()
    out = []
    for i in range(int(contexts.offsets[k]), int(contexts.offsets[k + 1])):
        column, table = names[int(contexts.column[i])].split(" of ")
        sem = int(contexts.sem[i])
        mean, std = side.stats.scales.get(f"{table}.{column}", (0.0, 1.0))
        if contexts.is_target[i]:
            value = "?"
        elif sem == SEM_NUMBER:
            value = f"{round(float(contexts.number[i]) * std + mean, 3)}"
        elif sem == SEM_DATETIME:
            seconds = round(float(contexts.datetime[i]) * std + mean)
            value = dt.datetime.fromtimestamp(seconds, dt.UTC).replace(tzinfo=None).isoformat()
        elif sem == SEM_TEXT:
            value = contexts.strings[int(contexts.text[i])].as_py()
        else:
            assert sem == SEM_BOOLEAN
            value = f"{contexts.boolean[i]:.0f}"
        out.append((table, column, value))
    return sorted(out)


def test_a_customer_context_holds_exactly_its_rows_counted_by_hand(shop_spec, shop_files):
    """Budget = customer 1's own 24 cells: its row, its three orders and their seven lines, each
    non-null declared value once, nothing of another customer; the parents are the foreign keys."""
    side, contexts = _prepare(_rt(shop_spec, max_context_cells=OWN_CELLS), folder=shop_files)
    assert contexts.keys.to_pylist() == [1, 2, 3, 4, 5]
    assert contexts.lengths[0] == OWN_CELLS
    assert _decoded(side, contexts, 0) == CUSTOMER_1
    store, order = side.graph.store, side.graph.order
    sl = slice(int(contexts.offsets[0]), int(contexts.offsets[1]))
    node, parents = contexts.node[sl].tolist(), contexts.parents[sl].tolist()
    tables = [order[t] for t in contexts.table[sl].tolist()]
    entity = store.base["customers.c_id"]  # customer 1: the first entity row
    orders = {n for n, t in zip(node, tables, strict=True) if t == "orders"}
    assert len(orders) == 3 and len({n for n, t in zip(node, tables, strict=True) if t == "lines"}) == 7
    for t, p in zip(tables, parents, strict=True):
        assert p[1:] == [-1] * 4  # one foreign key per row
        assert p[0] in orders if t == "lines" else p[0] == entity
    # the library counts the same cells (its node_cells): the budget binds exactly there
    assert int(store.node_cells[np.unique(node)].sum()) == OWN_CELLS
    assert side.figures.budget_full >= 1
    # the root's rows carry no seed time: the tag says what the anchor is
    assert side.builder_tags()["relflow.library_context_builder"].endswith("anchor none: no seed time, every row)")


def test_with_the_full_budget_peers_join_but_a_held_out_label_never_does(shop_spec, shop_tables, write_tables):
    """validation_fraction 0.5 holds out customers 1 and 4; their churn is 'gone', a class no
    training row has. With the library's default budget every context also holds other customers'
    rows (the library pads from the task table), their training labels included ('no', 'yes'),
    and never 'gone', though both are labelled in the source."""
    c = shop_tables["customers"]
    churn = pa.array(["gone", "yes", "no", "gone", "no"])
    folder = write_tables({**shop_tables, "customers": c.set_column(c.schema.get_field_index("churn"), "churn", churn)})
    spec = _rt(shop_spec)
    spec["task"]["validation_fraction"] = 0.5
    side, contexts = _prepare(spec, folder=folder)
    train = contexts.train.tolist()
    assert train == [False, True, True, False, True]
    names = contexts.column_names.to_pylist()
    labels = (contexts.column == names.index("churn of customers")) & ~contexts.is_target
    seen = {contexts.strings[int(i)].as_py() for i in contexts.text[labels]}
    assert seen == {"no", "yes"}
    assert "gone" not in contexts.strings.to_pylist()
    assert int(contexts.is_target.sum()) == 5  # one masked target per context, held out or not
    task = side.graph.order.index("customers")
    for k in range(5):  # every context holds other customers' rows
        sl = slice(int(contexts.offsets[k]), int(contexts.offsets[k + 1]))
        assert len(set(contexts.node[sl][contexts.table[sl] == task].tolist())) > 1
    assert contexts.lengths[0] > OWN_CELLS  # customer 1's own rows, all of them, and more
    mine = _decoded(side, contexts, 0)
    assert all(mine.count(cell) >= CUSTOMER_1.count(cell) for cell in CUSTOMER_1)


def test_a_held_out_target_is_charged_one_cell_less(shop_spec, shop_tables, write_tables):
    """Finding: the library charges the target row ``cells - 1`` (its label is the query) whether
    or not that row has a label; a held-out row's label is withheld, so its context is counted one
    cell short and goes on to a peer. Training customer 1 stops at its 24 cells; held out, it does not."""
    c = shop_tables["customers"]
    churn = pa.array(["gone", "yes", "no", "gone", "no"])
    folder = write_tables({**shop_tables, "customers": c.set_column(c.schema.get_field_index("churn"), "churn", churn)})
    spec = _rt(shop_spec, max_context_cells=OWN_CELLS, num_walks=0)
    _, contexts = _prepare(spec, folder=folder)
    assert contexts.train[0] and contexts.lengths[0] == OWN_CELLS
    spec["task"]["validation_fraction"] = 0.5
    _, contexts = _prepare(spec, folder=folder)
    assert not contexts.train[0] and contexts.lengths[0] > OWN_CELLS


def _contexts_equal(a: Any, b: Any) -> None:
    for name in ("offsets", "node", "parents", "column", "table", "sem", "is_target", "number", "datetime", "text"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.strings.to_pylist() == b.strings.to_pylist()
    assert a.column_names.to_pylist() == b.column_names.to_pylist()


def test_a_database_source_gives_the_same_contexts_as_files(shop_spec, shop_tables, write_tables, tmp_path):
    """The shop in DuckDB, every table's rows in reverse order, and a line whose l_order is null
    (the first column the builder reads of that table): the same graph, the same contexts."""
    lines = shop_tables["lines"]
    orphan = pa.table({"l_order": pa.array([None], pa.int64()), "l_no": [1], "l_qty": [12.0], "l_flag": ["B"]})
    tables = {**shop_tables, "lines": pa.concat_tables([lines, orphan.cast(lines.schema)])}
    files = write_tables(tables, folder=tmp_path / "files")
    reverse = {k: t.take(pa.array(range(t.num_rows - 1, -1, -1))) for k, t in tables.items()}
    write_tables(reverse, folder=tmp_path / "db")
    databases.build_duckdb(tmp_path / "db", tmp_path / "shop.duckdb", {})
    spec = _rt(shop_spec, num_walks=200, walk_length=4)
    side_f, from_files = _prepare(spec, folder=files)
    on_db = copy.deepcopy(spec)
    on_db["source"] = {"database": {"url": "duckdb:shop.duckdb"}}
    parsed = parse_spec(on_db)
    side_d, from_db = _prepare(on_db, sources=databases.resolve_database(parsed, tmp_path, None))
    assert side_d.graph.store.n_nodes == side_f.graph.store.n_nodes == 5 + 5 + 8 + 12
    _contexts_equal(from_db, from_files)
    assert side_d.stats.scales == side_f.stats.scales


def _timed(shop_spec: dict[str, Any], shop_tables: dict[str, pa.Table], write_tables: Any) -> tuple[dict, Path]:
    """Each customer's seed time (c_seed) and orders' time o_date: customer 1 at 2024-02-15 keeps
    orders 10 and 11, not 12 (2024-03-01) nor its lines; customer 2's only order has no time."""
    c = shop_tables["customers"]
    seeds = [dt.datetime(2024, 2, 15), dt.datetime(2024, 6, 1), dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 12)]
    seeds.append(dt.datetime(2024, 5, 1))
    folder = write_tables({**shop_tables, "customers": c.append_column("c_seed", pa.array(seeds, pa.timestamp("us")))})
    spec = copy.deepcopy(shop_spec)
    spec["schema"]["root"]["seed_time"] = "c_seed"
    spec["schema"]["branches"][0]["time"] = "o_date"
    return spec, folder


def test_a_time_anchored_spec_drops_every_row_after_the_seed_time(shop_spec, shop_tables, write_tables):
    spec, folder = _timed(shop_spec, shop_tables, write_tables)
    # customer 1 alone: its row with its seed time, orders 10 and 11 and their five lines (19 cells)
    side, contexts = _prepare(_rt(spec, max_context_cells=19), folder=folder)
    own = [
        ("customers", "churn", "?"),
        ("customers", "c_balance", "10.0"),
        ("customers", "c_segment", "a"),
        ("customers", "c_since", "2020-01-01T00:00:00"),
        ("customers", "c_seed", "2024-02-15T00:00:00"),
        *[("orders", "o_date", f"2024-0{m}-01T10:00:00") for m in (1, 2)],
        *[("orders", "o_total", v) for v in ("100.5", "200.0")],
        *[("orders", "o_status", v) for v in ("open", "done")],
        *[("lines", "l_qty", f"{q:.1f}") for q in (1, 2, 4, 5)],
        *[("lines", "l_flag", f) for f in "ABAB"],
    ]
    assert contexts.lengths[0] == len(own) == 19
    assert _decoded(side, contexts, 0) == sorted(own)
    # with the library's budget: peers and their orders join, but no context holds a cell of a row
    # after its own seed time, nor order 20 (no time: the as-of rule), nor order 12's lines
    side, contexts = _prepare(_rt(spec), folder=folder)
    store, graph = side.graph.store, side.graph
    anchors = np.repeat(graph.task_ts[graph.targets(contexts.keys)], contexts.lengths)
    ts = store.node_ts[contexts.node]
    assert not (ts > anchors).any()
    assert (~np.isnan(ts)).any() and (contexts.lengths > 19).any()
    assert 20 not in graph.g.tables["orders"]["o_id"].to_pylist()
    first = _decoded(side, contexts, 0)
    assert ("orders", "o_date", "2024-03-01T10:00:00") not in first
    assert ("lines", "l_qty", "6.0") not in first and ("lines", "l_qty", "7.0") not in first
    assert side.builder_tags()["relflow.library_context_builder"].endswith("anchor each row's seed time)")


def test_without_a_time_column_the_library_cannot_find_a_target(shop_spec, shop_files):
    """Finding: the library finds a context's target row by (entity, anchor), keyed with the
    anchor's epoch seconds: with no time (an unbounded bound, an undated task row) both are NaN,
    which never equal each other as dict keys, so it reports 'no task row' and, by default, returns
    an EMPTY context. The builder gives untimed task rows one constant time instead."""
    from relational_transformers_utils import ColumnarTraversal

    side, _ = _prepare(_rt(shop_spec), folder=shop_files)
    graph = side.graph
    calls: list[str] = []
    undated = ColumnarTraversal(graph.store, task_adapter=graph.adapter, fallback=calls.append)
    res = undated.traverse(
        graph.schema, None, graph.g.entity, 1, TemporalBound.unbounded(), graph.policy, query=graph.adapter
    )
    assert res.node_ids == () and calls and "no task row" in calls[0]
    anchor = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    res = graph.traversal.traverse(
        graph.schema, None, graph.g.entity, 1, TemporalBound.at_or_before(anchor), graph.policy, query=graph.adapter
    )
    assert len(res.node_ids) > 0


# --- what stays refused (exit 2, naming the key) ------------------------------------------------


def _keys(spec: dict[str, Any]) -> list[str]:
    return [r.key for r in refusals(parse_spec(spec))]


def test_the_spec_schema_is_no_longer_refused_and_what_it_cannot_graph_is(shop_spec):
    assert _keys(_rt(shop_spec)) == []
    keyed = _rt(shop_spec)
    keyed["schema"]["root"]["columns"]["c_id"] = "numeric"
    keyed["schema"]["branches"][0]["columns"]["o_id"] = "numeric"
    assert _keys(keyed) == ["schema.root.columns.c_id", "orders.columns.o_id"]
    self_join = _rt(shop_spec)
    self_join["schema"]["branches"][0]["branches"][0]["table"] = "customers"
    assert _keys(self_join) == ["lines.table"]
    twice = _rt(shop_spec)
    other = copy.deepcopy(twice["schema"]["branches"][0])
    other.update(name="orders_again", key="o_cust", branches=[])
    twice["schema"]["branches"].append(other)
    assert _keys(twice) == ["orders_again.key"]


def test_root_rows_the_library_cannot_find_exit_2(shop_spec, shop_tables, write_tables):
    """Two root rows of one entity with no seed time, and a root row without a seed time."""
    c = shop_tables["customers"]
    spec = _rt(shop_spec)
    spec["schema"]["root"]["entity"] = "c_group"
    folder = write_tables({**shop_tables, "customers": c.append_column("c_group", pa.array([1, 1, 2, 3, 4]))})
    with pytest.raises(UserError, match=r"repeat .* set schema\.root\.seed_time") as err:
        _prepare(spec, folder=folder)
    assert err.value.exit_code == 2
    spec, folder = _timed(shop_spec, shop_tables, write_tables)
    c = pq.read_table(folder / "customers.parquet")
    seeds = pa.array([*c["c_seed"].to_pylist()[:2], None, *c["c_seed"].to_pylist()[3:]], pa.timestamp("us"))
    write_tables({**shop_tables, "customers": c.set_column(c.schema.get_field_index("c_seed"), "c_seed", seeds)})
    with pytest.raises(UserError, match=r"no seed time \(schema\.root\.seed_time 'c_seed'\)"):
        _prepare(_rt(spec), folder=folder)


@pytest.mark.slow
def test_a_flow_run_over_the_spec_schema_finishes(
    prefect_harness, shop_spec, shop_tables, write_tables, tmp_path, monkeypatch
):
    """Customers 1 and 4 held out (validation_fraction 0.5); customer 2 churns, so the training
    split has both classes."""
    from mlflow.tracking import MlflowClient

    from flows.benchmark import benchmark

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    c = shop_tables["customers"]
    churn = pa.array(["yes", "yes", "no", "yes", "no"])
    folder = write_tables({**shop_tables, "customers": c.set_column(c.schema.get_field_index("churn"), "churn", churn)})
    spec = _rt(shop_spec, num_walks=200, walk_length=6)
    spec["task"]["validation_fraction"] = 0.5
    spec["run"].update(min_steady_batches=1, min_steady_seconds=0.001, system_metrics_interval_s=0)
    summary = benchmark(spec=parse_spec(spec).to_dict(), spec_dir=str(folder))
    run = MlflowClient(tracking_uri=uri).get_run(summary["run_id"])
    assert run.info.status == "FINISHED"
    m, tags = run.data.metrics, run.data.tags
    assert tags["relflow.library_context_builder"].endswith("anchor none: no seed time, every row)")
    assert m["rt.context.contexts"] >= m["data.rows_predicted"] == 5
    # customer 1's context holds its own 24 cells; none holds more than the 53 the graph has
    assert OWN_CELLS <= m["rt.context.cells_max"] <= 53
    assert m["rt.context.store_seconds"] > 0 and m["rt.context.assembly_seconds"] > 0
    assert m["encode.text_cache_hits"] > 0
