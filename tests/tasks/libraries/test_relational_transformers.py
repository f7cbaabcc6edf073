"""relational-transformers 0.1.0 under the harness (tasks/libraries/relational_transformers).

Real library, no mocks: contexts are built from the harness's own preprocess output, and
every prediction goes through the library's RelationalTransformer. Each silent hazard of the
library is shown to be impossible by construction or refused, and each test can fail: the
hazard tests also show the library's own behaviour that makes the hazard real (a colliding
node id moves the prediction; a context with no target cell scores exactly 0.5).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"  # never the hub, whatever a test does

from relational_transformers import (  # noqa: E402
    RelationalExample,
    RelationalTrainer,
    RelationalTrainingArguments,
    RTJModel,
)
from relational_transformers.model import _collate_batches  # noqa: E402

from tasks.libraries.relational_transformers import (  # noqa: E402
    D_TEXT,
    RT_J,
    ContextConfig,
    RelationalTransformers,
    RTDriver,
    build_contexts,
    cells_padded,
    cells_present,
    check,
    collate,
    encode,
    fit_stats,
    hashing_encoder,
    inspect_meta,
    plan_batches,
)
from tasks.libraries.relational_transformers.driver import ModelDims, first_cell  # noqa: E402
from tasks.measure.cell_flops import CellMoments  # noqa: E402
from tasks.runtime.errors import UserError  # noqa: E402
from tasks.spec import Spec, parse_spec  # noqa: E402
from tasks.stages.preprocess import preprocess  # noqa: E402
from tasks.stages.retrieve import ROOT, Retrieved  # noqa: E402
from tasks.stages.split import with_train as with_train_roles  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- helpers -------------------------------------------------------------------------------


def nested(raw: dict[str, Any], tables: dict[str, pa.Table]) -> tuple[Spec, pa.Table]:
    """The harness's preprocess over in-memory tables (node name -> rows)."""
    spec = parse_spec(raw, "(test)")
    pre = preprocess(spec, Retrieved(tables, bytes_read=0, root_rows=tables[ROOT].num_rows))
    return spec, pre.table


def shop(shop_spec: dict[str, Any], shop_tables: dict[str, pa.Table], **model: Any) -> tuple[Spec, pa.Table]:
    raw = copy.deepcopy(shop_spec)
    raw["model"] = {"d_model": 32, "layers": 2, "heads": 4, **model}
    t = shop_tables
    return nested(raw, {ROOT: t["customers"], "orders": t["orders"], "lines": t["lines"]})


def with_train(table: pa.Table, train: list[bool]) -> pa.Table:
    return with_train_roles(table, train, table.column_names[0])


def binary_shop(shop_spec: dict[str, Any], shop_tables: dict[str, pa.Table]) -> tuple[Spec, pa.Table]:
    raw = copy.deepcopy(shop_spec)
    raw["task"] = {"target": "churn", "kind": "binary"}
    customers = shop_tables["customers"]
    churn = pa.array([v == "yes" for v in customers.column("churn").to_pylist()], pa.bool_())
    tables = {
        **shop_tables,
        "customers": customers.set_column(customers.schema.get_field_index("churn"), "churn", churn),
    }
    return shop(raw, tables)


def everything(spec: Spec, table: pa.Table, config: ContextConfig | None = None):
    stats = fit_stats(table, spec)
    contexts = build_contexts(table, spec, stats, config)
    encoded = encode(contexts)
    return stats, contexts, encoded


def all_rows(contexts) -> np.ndarray:
    return np.arange(contexts.count)


# --- node ids ------------------------------------------------------------------------------


def overlapping_keys() -> tuple[dict[str, Any], dict[str, pa.Table]]:
    """Customers 1..3 whose orders are numbered 1..4 and lines 1..5: every table's natural
    keys overlap every other's."""
    raw = {
        "name": "overlap",
        "source": {"tables": {t: f"{t}.parquet" for t in ("c", "o", "l")}},
        "schema": {
            "root": {"table": "c", "key": "id", "columns": {"x": "numeric"}},
            "branches": [
                {
                    "name": "o",
                    "table": "o",
                    "parent_key": "cust",
                    "key": "id",
                    "max_length": 4,
                    "columns": {"y": "numeric"},
                    "branches": [
                        {"name": "l", "table": "l", "parent_key": "ord", "max_length": 4, "columns": {"z": "numeric"}}
                    ],
                }
            ],
        },
        "task": {"target": "t", "kind": "regression"},
        "model": {"d_model": 32, "layers": 2, "heads": 4},
    }
    tables = {
        ROOT: pa.table({"id": [1, 2, 3], "x": [1.0, 2.0, 3.0], "t": [0.5, 1.5, 2.5]}),
        "o": pa.table({"id": [1, 2, 3, 4], "cust": [1, 1, 2, 3], "y": [10.0, 20.0, 30.0, 40.0]}),
        "l": pa.table({"id": [1, 2, 3, 4, 5], "ord": [1, 2, 2, 3, 1], "z": [5.0, 4.0, 3.0, 2.0, 1.0]}),
    }
    return raw, tables


def test_node_ids_are_unique_across_tables_whose_natural_keys_overlap():
    raw, tables = overlapping_keys()
    spec, table = nested(raw, tables)
    _, contexts, _ = everything(spec, table)
    # the natural keys do collide: a node id built from them would merge rows of different tables
    assert set(tables[ROOT]["id"].to_pylist()) & set(tables["o"]["id"].to_pylist()) & set(tables["l"]["id"].to_pylist())
    rows = {(int(t), int(n)) for t, n in zip(contexts.table, contexts.node, strict=True)}
    nodes = [n for _, n in rows]
    assert len(nodes) == len(set(nodes)), "a node id is shared by rows of two tables"
    assert len(rows) == 3 + 4 + 5  # every row of every table is its own node
    # every parent link points at a node of the parent table, inside the same context
    for i in range(contexts.count):
        cells = slice(contexts.offsets[i], contexts.offsets[i + 1])
        here = dict(zip(contexts.node[cells], contexts.table[cells], strict=True))
        for node_table, links in zip(contexts.table[cells], contexts.parents[cells], strict=True):
            parents = [p for p in links if p >= 0]
            assert len(parents) == (0 if node_table == 0 else 1)
            assert all(here[p] == node_table - 1 for p in parents)


def test_a_node_id_collision_moves_the_prediction_so_it_must_never_happen(shop_spec, shop_tables):
    """The library's hazard, shown: the same context with one order's node id equal to the
    root's predicts something else, and nothing raises."""
    spec, table = binary_shop(shop_spec, shop_tables)
    stats, contexts, encoded = everything(spec, table)
    batch = collate(contexts, encoded, [0])
    driver = RTDriver.from_spec(spec, stats)
    before = driver.scores(batch)
    values = batch.as_dict()
    order_cell = int(torch.nonzero(batch.table_name_idxs[0] == 1)[0, 0])
    collided = values["node_idxs"].clone()
    collided[0, collided[0] == collided[0, order_cell]] = int(batch.node_idxs[0, 0])  # the root's id
    values["node_idxs"] = collided
    after = driver.scores(type(batch)(**values))
    assert not torch.allclose(before, after, atol=1e-6)


# --- exactly one target cell --------------------------------------------------------------


def test_every_context_has_exactly_one_target_cell_also_when_the_label_is_null_or_absent(shop_spec, shop_tables):
    spec, table = binary_shop(shop_spec, shop_tables)
    churn = table.column("churn").to_pylist()
    churn[2] = None
    table = table.set_column(table.schema.get_field_index("churn"), "churn", pa.array(churn, pa.bool_()))
    stats, contexts, encoded = everything(spec, table)
    batch = collate(contexts, encoded, all_rows(contexts))
    assert batch.is_targets.sum(1).tolist() == [1] * contexts.count
    labels, present = contexts.label_tensors(all_rows(contexts))
    assert present.tolist() == [True, True, False, True, True]  # null label: predicted, not trained on
    # a chunk without the target column at all (serving): still one target cell per context
    served = build_contexts(table.drop_columns(["churn"]), spec, stats)
    assert (
        np.bincount(np.repeat(np.arange(served.count), served.lengths), weights=served.is_target).tolist()
        == [1.0] * served.count
    )
    assert np.isnan(served.labels).all()


def test_the_label_never_enters_its_own_context(shop_spec, shop_tables):
    """Flipping every label leaves every prediction unchanged: the target cell is a query."""
    spec, table = binary_shop(shop_spec, shop_tables)
    stats, contexts, encoded = everything(spec, table)
    driver = RTDriver.from_spec(spec, stats)
    flipped_table = table.set_column(
        table.schema.get_field_index("churn"), "churn", pc_invert(table.column("churn").combine_chunks())
    )
    flipped = build_contexts(flipped_table, spec, stats)
    rows = all_rows(contexts)
    assert not np.array_equal(contexts.labels, flipped.labels)
    assert torch.equal(
        driver.scores(collate(contexts, encoded, rows)), driver.scores(collate(flipped, encode(flipped), rows))
    )


def pc_invert(arr: pa.Array) -> pa.Array:
    import pyarrow.compute as pc

    return pc.invert(arr)


def test_a_context_without_or_with_two_target_cells_is_refused_by_collate(shop_spec, shop_tables):
    spec, table = binary_shop(shop_spec, shop_tables)
    stats, contexts, encoded = everything(spec, table)
    driver = RTDriver.from_spec(spec, stats)
    # the library's hazard, shown: no target cell scores exactly 0.5, with no error
    values = collate(contexts, encoded, [0]).as_dict()
    values["is_targets"] = torch.zeros_like(values["is_targets"])
    assert driver.predict(type(collate(contexts, encoded, [0]))(**values)).item() == 0.5
    none = dataclasses.replace(contexts, is_target=np.zeros_like(contexts.is_target))
    with pytest.raises(RuntimeError, match="target cells"):
        collate(none, encoded, [0])
    two = contexts.is_target.copy()
    two[contexts.offsets[0] + 1] = True
    with pytest.raises(RuntimeError, match="target cells"):
        collate(dataclasses.replace(contexts, is_target=two), encoded, [0])


def test_a_target_listed_as_an_input_column_is_refused(shop_spec, shop_tables):
    raw = copy.deepcopy(shop_spec)
    raw["schema"]["root"]["columns"]["churn"] = "category"
    spec, _ = shop(raw, shop_tables)
    with pytest.raises(UserError, match=r"schema\.root\.columns\.churn.*leak"):
        check(spec)


# --- parents and depth ----------------------------------------------------------------------


def chain(depth: int, layers: int) -> tuple[dict[str, Any], dict[str, pa.Table]]:
    """A root with branches nested ``depth`` levels deep, one row per level per root."""

    def branch(level: int) -> dict[str, Any]:
        b: dict[str, Any] = {
            "name": f"b{level}",
            "table": f"t{level}",
            "parent_key": "up",
            "key": "k",
            "max_length": 2,
            "columns": {"v": "numeric"},
        }
        if level < depth:
            b["branches"] = [branch(level + 1)]
        return b

    raw = {
        "name": "chain",
        "source": {"tables": {f"t{i}": f"t{i}.parquet" for i in range(depth + 1)}},
        "schema": {"root": {"table": "t0", "key": "k", "columns": {"v": "numeric"}}, "branches": [branch(1)]},
        "task": {"target": "y", "kind": "binary"},
        "model": {"d_model": 16, "layers": layers, "heads": 2},
    }
    tables = {ROOT: pa.table({"k": [1, 2], "v": [0.1, 0.2], "y": [True, False]})}
    for i in range(1, depth + 1):
        tables[f"b{i}"] = pa.table({"k": [1, 2], "up": [1, 2], "v": [float(i), float(-i)]})
    return raw, tables


def test_more_than_five_parents_is_a_user_error_naming_the_branch_before_any_work():
    raw, tables = chain(depth=6, layers=6)
    spec = parse_spec(raw, "(test)")
    with pytest.raises(UserError, match=r"branch 'b6'.*at most 5") as err:
        check(spec, links="ancestors")
    assert "b5" not in str(err.value)  # only the branch that is too deep
    check(spec)  # parent links: one parent per row, any depth
    spec, table = nested(raw, tables)
    stats = fit_stats(table, spec)
    with pytest.raises(UserError, match="branch 'b6'"):
        build_contexts(table, spec, stats, ContextConfig(links="ancestors"))
    five = build_contexts(table, spec, stats, ContextConfig(links="parent"))
    assert ((five.parents >= 0).sum(1) <= 1).all()


def test_ancestor_links_carry_every_ancestor_up_to_five():
    raw, tables = chain(depth=5, layers=5)
    spec, table = nested(raw, tables)
    contexts = build_contexts(table, spec, fit_stats(table, spec), ContextConfig(links="ancestors"))
    counts = (contexts.parents >= 0).sum(1)
    assert sorted(set(zip(contexts.table.tolist(), counts.tolist(), strict=True))) == [(d, d) for d in range(6)]


def test_a_branch_deeper_than_the_blocks_never_reaches_the_prediction_and_is_refused(shop_spec, shop_tables):
    """RT-J moves information one foreign-key hop per block: with one block, a line (two hops
    below the customer) cannot move the prediction at all; an order (one hop) can. With two
    blocks, or ancestor links, the line does."""

    def moved(spec: Spec, table: pa.Table, column: str, config: ContextConfig | None = None) -> float:
        stats, contexts, encoded = everything(spec, table, config)
        driver = RTDriver.from_spec(spec, stats)
        batch = collate(contexts, encoded, [0])
        values = batch.as_dict()
        cell = int(
            torch.nonzero(
                batch.col_name_idxs[0]
                == int(np.flatnonzero(contexts.column_names.to_numpy(zero_copy_only=False) == column)[0])
            )[0, 0]
        )
        values["number_values"] = values["number_values"].clone()
        values["number_values"][0, cell, 0] += 3.0
        return float((driver.scores(batch) - driver.scores(type(batch)(**values))).abs().max())

    one = shop(shop_spec, shop_tables, layers=1)
    assert moved(*one, "l_qty of lines") == 0.0
    assert moved(*one, "o_total of orders") > 0.0
    with pytest.raises(UserError, match=r"branch 'lines' depth=2.*model\.layers to at least 2"):
        check(one[0])
    assert moved(*one, "l_qty of lines", ContextConfig(links="ancestors")) > 0.0
    two = shop(shop_spec, shop_tables, layers=2)
    assert moved(*two, "l_qty of lines") > 0.0
    check(two[0])


# --- statistics, encoding, collation ------------------------------------------------------


def test_normalisation_uses_the_training_rows_only(shop_spec, shop_tables):
    spec, table = shop(shop_spec, shop_tables)
    all_train = fit_stats(table, spec)
    # customer 5 (balance 50) held out: the balance mean is that of 10, 30, 40
    held = with_train(table, [True, True, True, True, False])
    stats = fit_stats(held, spec)
    assert stats.scales["root.c_balance"][0] == pytest.approx(np.mean([10.0, 30.0, 40.0]))
    assert all_train.scales["root.c_balance"][0] == pytest.approx(np.mean([10.0, 30.0, 40.0, 50.0]))
    # customer 5's order (o_total 5.00) is not in the training mean either
    assert stats.scales["orders.o_total"][0] != pytest.approx(all_train.scales["orders.o_total"][0])
    contexts = build_contexts(held, spec, stats)
    balance = contexts.number[(contexts.column == 0) & np.repeat(contexts.train, contexts.lengths)]
    assert balance.mean() == pytest.approx(0.0, abs=1e-6)
    assert stats.classes == ("no", "yes")


def test_integers_beyond_2_53_are_normalised_rounded_not_refused(shop_spec, shop_tables_big_ints):
    """A checked float64 cast refused the column ('Integer value ... not in range')."""
    spec, table = shop(shop_spec, shop_tables_big_ints)
    stats, contexts, _ = everything(spec, table)
    assert stats.scales["root.c_balance"][0] == pytest.approx(np.mean([2.0**62, 3.0, 2.0**53, -(2.0**60)]))
    balance = contexts.number[contexts.column == 0]
    assert balance.size == 4 and np.isfinite(balance).all()  # customer 2's null is no cell


def test_timestamps_of_every_unit_and_dates_are_seconds_since_1970(
    shop_spec, shop_tables, shop_tables_times, time_type
):
    """Every unit, naive or zoned (ns ticks pass 2**53: no checked cast may meet them), and
    dates: the same seconds since 1970 (UTC) as the timestamp[us] / date32 shop, dates at
    midnight, so the same statistics and cells."""
    spec, table = shop(shop_spec, shop_tables_times)
    # Polars (preprocess) holds no s unit and no date64 (it gives timestamp[ms] for both): the
    # root's c_since is put back as stored, so the library meets each type itself
    customers = shop_tables_times["customers"]
    assert table["c_id"].to_pylist() == customers["c_id"].to_pylist()
    table = table.set_column(table.schema.get_field_index("c_since"), "c_since", customers["c_since"])
    assert table.schema.field("c_since").type == time_type
    stats, contexts, _ = everything(spec, table)
    before, before_contexts = everything(*shop(shop_spec, shop_tables))[:2]
    assert stats.scales["root.c_since"] == pytest.approx(before.scales["root.c_since"], rel=1e-12)
    if pa.types.is_date(time_type):  # o_date's hours (8 to 12) dropped: the mean moves less than a day
        mean, hours_kept = stats.scales["orders.o_date"][0], before.scales["orders.o_date"][0]
        assert hours_kept - 86_400 < mean < hours_kept
        assert np.isfinite(contexts.number).all()
    else:
        assert stats.scales["orders.o_date"] == pytest.approx(before.scales["orders.o_date"], rel=1e-12)
        np.testing.assert_allclose(contexts.number, before_contexts.number, rtol=1e-9, atol=1e-9)


def test_nulls_are_no_cell_and_present_values_are_one_cell_each(shop_spec, shop_tables):
    spec, table = shop(shop_spec, shop_tables)
    _, contexts, _ = everything(spec, table)
    # customer 2: balance null, segment 'b', since, 1 order (20: date null, total, status null), 1 line
    c2 = slice(contexts.offsets[1], contexts.offsets[2])
    names = contexts.column_names.to_pylist()
    assert sorted(names[i] for i in contexts.column[c2]) == sorted(
        [
            "c_segment of customers",
            "c_since of customers",
            "churn of customers",
            "o_total of orders",
            "l_qty of lines",
            "l_flag of lines",
        ]
    )


def test_the_hashing_encoder_is_deterministic_unit_length_and_384_wide():
    strings = pa.array(["open", "done", "Open", "open order", "", "open"], pa.large_string())
    shifted = pa.concat_arrays([pa.array(["x"], pa.large_string()), strings]).slice(1)  # a non-zero offset
    a, b = hashing_encoder(strings), hashing_encoder(shifted)
    assert a.shape == (6, D_TEXT) and np.array_equal(a, b)
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(a[0], a[5])
    assert not np.allclose(a[0], a[1])
    cos = a @ a.T
    assert cos[0, 3] > cos[1, 3]  # "open order" is nearer "open" than "done"


def test_a_wrong_encoder_width_is_a_user_error(shop_spec, shop_tables):
    spec, table = shop(shop_spec, shop_tables)
    contexts = build_contexts(table, spec, fit_stats(table, spec))
    with pytest.raises(UserError, match="384"):
        encode(contexts, lambda s: np.zeros((len(s), 64), np.float32))


def test_collate_gives_what_the_librarys_own_collation_gives(shop_spec, shop_tables):
    spec, table = shop(shop_spec, shop_tables)
    _, contexts, encoded = everything(spec, table)
    rows = [3, 0, 4, 1, 2]
    ours = collate(contexts, encoded, rows)
    singles = [collate(contexts, encoded, [r]) for r in rows]
    theirs = _collate_batches(singles)
    for name, tensor in ours.as_dict().items():
        assert torch.equal(tensor, theirs.as_dict()[name]), name
    assert cells_present(ours) == int(contexts.lengths.sum())
    assert cells_padded(ours) == len(rows) * int(contexts.lengths.max())


def test_plan_batches_covers_every_row_once():
    lengths = np.array([5, 50, 7, 6, 49, 8, 51, 5, 9, 48], dtype=np.int64)
    for bucketing in ("off", "by_length"):
        for seed in (None, 3):
            plan = plan_batches(lengths, 3, bucketing, bucket_count=2, shuffle_seed=seed)
            assert sorted(np.concatenate(plan).tolist()) == list(range(10))
            assert [len(b) for b in plan][-1] == 1 and all(len(b) == 3 for b in plan[:-1])
    sorted_plan = plan_batches(lengths, 3, "by_length")
    assert [lengths[b].tolist() for b in sorted_plan][:2] == [[5, 5, 6], [7, 8, 9]]


# --- bucketing equivalence ------------------------------------------------------------------


def mixed_lengths(n: int = 24, seed: int = 0) -> tuple[Spec, pa.Table]:
    """Customers with 0..12 orders of 0..3 lines: contexts from 2 to ~60 cells."""
    rng = np.random.default_rng(seed)
    orders_per = rng.integers(0, 13, n)
    o_cust = np.repeat(np.arange(n), orders_per)
    lines_per = rng.integers(0, 4, len(o_cust))
    l_order = np.repeat(np.arange(len(o_cust)), lines_per)
    raw = {
        "name": "mixed",
        "source": {"tables": {t: f"{t}.parquet" for t in ("c", "o", "l")}},
        "schema": {
            "root": {"table": "c", "key": "cid", "columns": {"seg": "category"}},
            "branches": [
                {
                    "name": "o",
                    "table": "o",
                    "parent_key": "cust",
                    "key": "oid",
                    "max_length": 12,
                    "columns": {"amount": "numeric", "when": "timestamp"},
                    "branches": [
                        {
                            "name": "l",
                            "table": "l",
                            "parent_key": "ord",
                            "max_length": 3,
                            "columns": {"q": "numeric", "flag": "category"},
                        }
                    ],
                }
            ],
        },
        "task": {"target": "y", "kind": "binary"},
        "model": {"d_model": 32, "layers": 2, "heads": 4},
    }
    tables = {
        ROOT: pa.table({"cid": np.arange(n), "seg": rng.choice(["a", "b", "c"], n), "y": rng.random(n) > 0.5}),
        "o": pa.table(
            {
                "oid": np.arange(len(o_cust)),
                "cust": o_cust,
                "amount": rng.normal(100, 30, len(o_cust)),
                "when": pa.array(rng.integers(1.6e9, 1.7e9, len(o_cust)) * 1_000_000, pa.timestamp("us")),
            }
        ),
        "l": pa.table(
            {
                "ord": l_order,
                "q": rng.integers(1, 9, len(l_order)).astype(float),
                "flag": rng.choice(["A", "B"], len(l_order)),
            }
        ),
    }
    return nested(raw, tables)


def predict_all(driver: RTDriver, contexts, encoded, plan: list[np.ndarray]) -> tuple[torch.Tensor, int]:
    out = torch.empty(contexts.count)
    padded = 0
    for rows in plan:
        batch = collate(contexts, encoded, rows)
        out[torch.from_numpy(rows)] = driver.predict(batch)
        padded += cells_padded(batch)
    return out, padded


def test_bucketing_by_length_gives_the_same_prediction_per_row_as_natural_order():
    spec, table = mixed_lengths()
    stats, contexts, encoded = everything(spec, table)
    driver = RTDriver.from_spec(spec, stats)
    assert contexts.lengths.max() > 4 * contexts.lengths.min()
    natural, natural_cells = predict_all(driver, contexts, encoded, plan_batches(contexts.lengths, 6, "off"))
    bucketed, bucketed_cells = predict_all(
        driver, contexts, encoded, plan_batches(contexts.lengths, 6, "by_length", bucket_count=4)
    )
    assert (natural - bucketed).abs().max().item() <= 1e-5
    assert bucketed_cells < natural_cells  # and it did regroup: fewer padded cells


# --- driver: size, checkpoints, weights ----------------------------------------------------


def test_meta_parameter_counts_equal_a_materialised_models():
    dims = ModelDims(num_blocks=3, d_model=64, num_heads=4, d_ff=256)
    meta = inspect_meta(dims)
    model = RTJModel(dims.num_blocks, dims.d_model, dims.d_text, dims.num_heads, dims.d_ff)
    assert meta.on_meta
    assert meta.total == sum(p.numel() for p in model.parameters())
    assert list(meta.per_block) == [sum(p.numel() for p in b.parameters()) for b in model.blocks]
    assert meta.total == sum(meta.per_block) + meta.encoders + meta.decoders + meta.norm_out
    rtj = inspect_meta(RT_J)  # the published size, without allocating 342 MB
    assert rtj.on_meta and round(rtj.total / 1e5) == 856  # the docs' 85.6M


def test_meta_counts_a_checkpoint_without_attention_gates_as_the_torch_backend_builds_it(tmp_path):
    """The library's meta backend reads the config only and always counts the gates (wg,
    scale); the torch backend builds a gate-less model for gate-less weights."""
    from relational_transformers import RelationalTransformer
    from relational_transformers.checkpoints import save_checkpoint

    dims = ModelDims(num_blocks=2, d_model=32, num_heads=4, d_ff=128)
    legacy = RTJModel(dims.num_blocks, dims.d_model, dims.d_text, dims.num_heads, dims.d_ff, legacy_attn=True)
    save_checkpoint(legacy, tmp_path, dims.config())
    library_meta = RelationalTransformer(tmp_path, backend="meta")
    materialised = sum(p.numel() for p in RelationalTransformer(tmp_path, device="cpu").model.parameters())
    assert sum(p.numel() for p in library_meta.model.parameters()) > materialised  # the library's count
    ours = inspect_meta(checkpoint=tmp_path)
    assert ours.legacy_attention and ours.on_meta and ours.total == materialised


def test_a_missing_checkpoint_is_a_user_error_naming_it_and_never_a_hub_lookup(
    shop_spec, shop_tables, tmp_path, monkeypatch
):
    import huggingface_hub

    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"hub lookup: {args}")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    spec, table = shop(shop_spec, shop_tables)
    stats = fit_stats(table, spec)
    for missing in (tmp_path / "no-such-checkpoint", "RelativeDB/rt-j-fp16"):
        with pytest.raises(UserError, match=str(missing)):
            RTDriver.from_spec(spec, stats, checkpoint=missing)
    raw = copy.deepcopy(shop_spec)
    raw["model"]["layers"] = 2
    raw["run"]["checkpoint"] = str(tmp_path / "gone")
    with pytest.raises(UserError, match=r"run\.checkpoint=.*gone.*never does"):
        check(parse_spec(raw, "(test)"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no config.json"):
        RTDriver.from_spec(spec, stats, checkpoint=tmp_path / "empty")


def test_quantized_checkpoints_load_close_to_fp32_and_all_expand_to_fp32(shop_spec, shop_tables, tmp_path):
    spec, table = binary_shop(shop_spec, shop_tables)
    raw = spec.to_dict()
    raw["model"] = {"d_model": 64, "layers": 2, "heads": 4}
    spec = parse_spec(raw, "(test)")
    stats, contexts, encoded = everything(spec, table)
    batch = collate(contexts, encoded, all_rows(contexts))
    driver = RTDriver.from_spec(spec, stats)
    reference = driver.predict(batch)
    delta, size = {}, {}
    for fmt in ("fp32", "fp16", "fp8", "int8", "int4"):
        saved = driver.save(tmp_path / fmt, fmt)
        loaded = RTDriver.from_spec(spec, checkpoint=saved.directory)
        assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}  # no runtime saving
        delta[fmt] = float((loaded.predict(batch) - reference).abs().max())
        size[fmt] = saved.weight_file_bytes
        assert (saved.quantized_tensors > 0) == (fmt in ("fp8", "int8", "int4"))
    print("max |p - p_fp32|:", delta, "weight file bytes:", size)
    assert delta["fp32"] == 0.0
    assert delta["fp16"] < 1e-3
    assert delta["int8"] < 1e-2
    assert size["int4"] < size["int8"] < size["fp16"] < size["fp32"]


def test_category_checkpoint_round_trip_restores_head_and_statistics(shop_spec, shop_tables, tmp_path):
    spec, table = shop(shop_spec, shop_tables)
    stats, contexts, encoded = everything(spec, table)
    batch = collate(contexts, encoded, all_rows(contexts))
    driver = RTDriver.from_spec(spec, stats)
    labels, present = contexts.label_tensors(all_rows(contexts))
    losses = [driver.train_step(batch, labels, present) for _ in range(8)]
    assert losses[-1] < losses[0]
    probs = driver.predict(batch)
    assert probs.shape == (contexts.count, len(stats.classes))
    driver.save(tmp_path / "ckpt")
    loaded = RTDriver.from_spec(spec, checkpoint=tmp_path / "ckpt")  # statistics from the folder
    assert loaded.stats == stats
    assert torch.allclose(loaded.predict(batch), probs, atol=1e-6)


def test_the_train_step_is_the_librarys_trainer_step(shop_spec, shop_tables, tmp_path):
    """One step of RelationalTrainer over the same five contexts: same loss, same weights."""
    spec, table = binary_shop(shop_spec, shop_tables)
    raw = spec.to_dict()
    raw["run"]["adamw"] = {"fused": None, "weight_decay": 0.01}
    raw["run"]["learning_rate"] = 1e-4
    spec = parse_spec(raw, "(test)")
    stats, contexts, encoded = everything(spec, table)
    rows = all_rows(contexts)
    labels, present = contexts.label_tensors(rows)
    ours, theirs = RTDriver.from_spec(spec, stats), RTDriver.from_spec(spec, stats)
    loss = ours.train_step(collate(contexts, encoded, rows), labels, present)
    examples = [RelationalExample(collate(contexts, encoded, [r]), float(labels[r])) for r in rows]
    args = RelationalTrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=len(rows),
        learning_rate=1e-4,
        weight_decay=0.01,
        save_strategy="no",
    )
    trainer = RelationalTrainer(model=theirs.transformer, args=args, train_dataset=examples, problem_type="binary")
    trainer.train()
    assert loss == pytest.approx(trainer.losses[0], abs=1e-6)
    for (name, a), b in zip(ours.model.named_parameters(), theirs.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name


def test_a_binary_target_that_does_not_read_as_boolean_is_a_user_error(shop_spec, shop_tables):
    raw = copy.deepcopy(shop_spec)
    raw["task"] = {"target": "churn", "kind": "binary"}  # 'yes' / 'no'
    spec, table = shop(raw, shop_tables)
    with pytest.raises(UserError, match="churn.*booleans"):
        build_contexts(table, spec, fit_stats(table, spec))


def test_regression_predicts_in_the_targets_units(tmp_path):
    raw, tables = overlapping_keys()
    spec, table = nested(raw, tables)
    stats, contexts, encoded = everything(spec, table)
    assert stats.target_mean == pytest.approx(1.5)
    driver = RTDriver.from_spec(spec, stats)
    batch = collate(contexts, encoded, all_rows(contexts))
    scores, values = driver.scores(batch), driver.predict(batch)
    assert torch.allclose(values, scores * stats.target_std + stats.target_mean)


def test_flops_are_counted_for_torch_and_refused_with_a_reason_for_onnx(shop_spec, shop_tables, tmp_path):
    spec, table = binary_shop(shop_spec, shop_tables)
    stats, contexts, encoded = everything(spec, table)
    batch = collate(contexts, encoded, all_rows(contexts))
    driver = RTDriver.from_spec(spec, stats)
    count = driver.flops(batch)
    assert count.flops is not None and count.flops > 0 and count.reason is None
    half = driver.flops(collate(contexts, encoded, [0, 1]))
    assert half.flops is not None and half.flops < count.flops
    onnx = driver.onnx(driver.export_onnx(tmp_path / "m.onnx", batch), intra_op_threads=1)
    assert onnx.flops(batch).flops is None and "ONNX Runtime" in str(onnx.flops(batch).reason)


@pytest.mark.parametrize("task", ["binary", "category"])
def test_the_flop_model_gives_torchs_count_of_a_padded_batch_and_of_each_context_alone(shop_spec, shop_tables, task):
    """compute.mfu (present) and compute.mfu_reserved (padded) of a relational-transformers run
    come from one FLOP model fitted on a single repeated cell: a whole padded batch must cost
    exactly FlopCounterMode's count of it, and its present FLOPs exactly the sum of each context
    run alone (at its own length). The old count (the first batch's per-row figure times every
    row) made the two equal whatever the padding."""
    spec, table = binary_shop(shop_spec, shop_tables) if task == "binary" else shop(shop_spec, shop_tables)
    stats, contexts, encoded = everything(spec, table)
    driver = RTDriver.from_spec(spec, stats)
    rows = all_rows(contexts)
    batch = collate(contexts, encoded, rows)
    fm = driver.flop_model(first_cell(batch))
    assert fm is not None and fm.quadratic > 0 and fm.linear > 0
    b, width = batch.is_padding.shape
    lengths = (~batch.is_padding).sum(1)
    assert len(set(lengths.tolist())) > 1  # contexts of several lengths: padding exists
    assert driver.flops(batch).flops == b * fm.context(width)
    moments = CellMoments()
    moments.add(batch.is_padding)
    alone = [driver.flops(collate(contexts, encoded, [int(i)])).flops for i in rows]
    assert moments.present_flops(fm) == sum(alone) < moments.padded_flops(fm) == driver.flops(batch).flops


@pytest.mark.parametrize("task", ["binary", "category"])
def test_onnx_through_the_librarys_backend_matches_torch_with_the_thread_count(shop_spec, shop_tables, tmp_path, task):
    spec, table = binary_shop(shop_spec, shop_tables) if task == "binary" else shop(shop_spec, shop_tables)
    stats, contexts, encoded = everything(spec, table)
    driver = RTDriver.from_spec(spec, stats)
    path = driver.export_onnx(tmp_path / "model.onnx", collate(contexts, encoded, [0, 1]))
    onnx = driver.onnx(path, intra_op_threads=0)
    assert onnx.backend.session.get_session_options().intra_op_num_threads == torch.get_num_threads() == 1
    for rows in ([0], [1, 2, 3, 4], [4, 0, 2]):  # other batch sizes and lengths than the example's
        batch = collate(contexts, encoded, rows)
        assert torch.allclose(onnx.predict(batch), driver.predict(batch), atol=1e-5)
    with pytest.raises(UserError, match="does not exist"):
        driver.onnx(tmp_path / "missing.onnx")


# --- check ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("run.backend", "triton", r"run\.backend='triton'.*needs CUDA.*device is cpu"),
        ("run.precision", "bf16", r"run\.precision='bf16'.*always runs fp32"),
        ("run.compile", {"encoders": True}, r"run\.compile\.encoders/pools"),
        ("model.dropout", 0.1, r"model\.dropout=0\.1"),
        ("task.branch", "orders", r"task\.branch='orders'.*one target cell"),
        ("task.outputs", ["prediction", "root_embedding"], r"task\.outputs=\['root_embedding'\]"),
        ("run.text.dim", 128, r"run\.text\.dim=128.*384"),
        ("run.loader", {"num_workers": 2}, r"run\.loader\.num_workers=2"),
    ],
)
def test_check_refuses_what_the_library_cannot_honour_naming_library_key_and_fix(shop_spec, key, value, match):
    raw = copy.deepcopy(shop_spec)
    raw["model"]["layers"] = 2
    raw["run"]["device"] = "cpu"
    section, _, name = key.partition(".")
    holder = raw[section]
    for part in name.split(".")[:-1]:
        holder = holder.setdefault(part, {})
    holder[name.split(".")[-1]] = value
    if key == "task.branch":
        raw["task"]["target"] = "o_status"
        del raw["schema"]["branches"][0]["columns"]["o_status"]
    spec = parse_spec(raw, "(test)")
    with pytest.raises(UserError, match=match) as err:
        RelationalTransformers().check(spec)
    assert str(err.value).startswith("model.library relational_transformers cannot honour")


def test_check_passes_a_spec_it_can_run(shop_spec):
    raw = copy.deepcopy(shop_spec)
    raw["model"]["layers"] = 2
    check(parse_spec(raw, "(test)"))


# --- slower: the library's compile, the default workload's shape ---------------------------


def compiled(spec: Spec) -> Spec:
    raw = spec.to_dict()
    raw["run"]["compile"] = {"model": True}
    return parse_spec(raw, "(test)")


def test_weights_saved_from_a_compiled_model_load_back(shop_spec, shop_tables, tmp_path):
    """The library's own save_pretrained after compile=True writes '_orig_mod.'-prefixed names
    that its loader cannot read; the driver saves the model under the compile wrapper."""
    spec, table = binary_shop(shop_spec, shop_tables)
    stats, contexts, encoded = everything(spec, table)
    driver = RTDriver.from_spec(compiled(spec), stats)  # compiles lazily: nothing runs here
    assert driver.transformer.model is not driver.model  # the torch.compile wrapper
    driver.transformer.save_pretrained(tmp_path / "library")
    with pytest.raises(RuntimeError, match="Missing key"):
        RTDriver.from_spec(spec, stats, checkpoint=tmp_path / "library")
    driver.save(tmp_path / "driver")
    reloaded = RTDriver.from_spec(spec, checkpoint=tmp_path / "driver")
    batch = collate(contexts, encoded, all_rows(contexts))
    assert torch.equal(reloaded.predict(batch), RTDriver.from_spec(spec, stats).predict(batch))


@pytest.mark.slow
def test_the_librarys_compile_gives_eager_predictions(shop_spec, shop_tables):
    """torch.compile(dynamic=True) of the whole model: about 50-100 s per compile on a busy
    2-core host. Batches of 4 and 3 contexts: a batch of 5 is duck-sized to f2p's width of 5
    and specialised on it."""
    spec, table = binary_shop(shop_spec, shop_tables)
    stats, contexts, encoded = everything(spec, table)
    eager, fast = RTDriver.from_spec(spec, stats), RTDriver.from_spec(compiled(spec), stats)
    for rows in ([0, 1, 2, 3], [2, 4, 3]):
        batch = collate(contexts, encoded, rows)
        assert torch.allclose(fast.predict(batch), eager.predict(batch), atol=1e-5)


@pytest.mark.slow
def test_tpch_orders_contexts_from_the_harness_chain(tpch_small):
    """The default workload's first 2,000 orders through the harness's own retrieve and
    preprocess: one context per order, its lines under it, a category head's probabilities."""
    from tasks.sources.files import resolve_sources
    from tasks.spec import load_spec
    from tasks.stages.retrieve import list_root_keys, retrieve

    raw = load_spec(Path(__file__).resolve().parents[3] / "benchmarks" / "tpch_orders.yaml").to_dict()
    raw["model"]["library"] = "relational_transformers"
    spec = parse_spec(raw, "(test)")
    check(spec)
    sources = resolve_sources(spec, tpch_small)
    keys, _ = list_root_keys(spec, sources)
    table = preprocess(spec, retrieve(spec, sources, keys[:2000])).table
    stats, contexts, encoded = everything(spec, table)
    assert contexts.count == 2000 and stats.classes == ("F", "O", "P")
    lines = table.column("lineitem").combine_chunks().value_lengths().fill_null(0).to_numpy()
    # each order: target + 2 root inputs + 7 cells per line (no nulls in TPC-H)
    assert np.array_equal(contexts.lengths, 3 + 7 * lines)
    driver = RTDriver.from_spec(spec, stats)
    plan = plan_batches(contexts.lengths, 256, "by_length")
    probs = driver.predict(collate(contexts, encoded, plan[0]))
    assert probs.shape == (256, 3) and torch.allclose(probs.sum(1), torch.ones(256), atol=1e-5)
