"""The benchmark spec: every validation error names its key; --set overrides; stable hash."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from tasks.runtime.errors import UserError
from tasks.spec import apply_overrides, load_spec, parse_spec

DEFAULT = Path(__file__).resolve().parents[3] / "benchmarks" / "tpch_orders.yaml"


def raw_default() -> dict:
    return yaml.safe_load(DEFAULT.read_text())


def error_of(raw: dict) -> str:
    with pytest.raises(UserError) as info:
        parse_spec(raw, "'spec.yaml'")
    return str(info.value)


def test_default_spec_is_valid():
    spec = load_spec(DEFAULT)
    assert spec.name == "tpch-orders"
    assert spec.schema_.branches[0].name == "lineitem"
    assert spec.schema_.branches[0].max_length == 8


@pytest.mark.parametrize(
    ("edit", "names"),
    [
        (lambda r: r["run"].update(batchsize=3), ["run.batchsize", "unknown key"]),
        (lambda r: r.update(extra_section={}), ["extra_section", "unknown key"]),
        (
            lambda r: r["schema"]["branches"][0].update(max_lenght=3),
            ["schema.branches.lineitem.max_lenght", "unknown key"],
        ),
    ],
    ids=["run-key", "top-level", "branch-key"],
)
def test_unknown_key_is_named(edit, names):
    raw = raw_default()
    edit(raw)
    msg = error_of(raw)
    for part in names:
        assert part in msg
    assert "spec.yaml" in msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    ("edit", "key", "shown"),
    [
        (lambda r: r["run"].update(batch_size="big"), "run.batch_size", "'big'"),
        (lambda r: r["run"].update(batch_size=0), "run.batch_size", "0"),
        (lambda r: r["schema"]["branches"][0].update(overflow="drop"), "overflow", "'drop'"),
        (
            lambda r: r["schema"]["root"]["columns"].update(o_comment="string"),
            "schema.root.columns.o_comment",
            "'string'",
        ),
        (lambda r: r["task"].update(kind="multiclass"), "task.kind", "'multiclass'"),
        (lambda r: r["run"].update(mode="serve"), "run.mode", "'serve'"),
    ],
    ids=["int-as-text", "non-positive", "overflow-rule", "column-kind", "task-kind", "mode"],
)
def test_mistyped_value_names_key_and_value(edit, key, shown):
    raw = raw_default()
    edit(raw)
    msg = error_of(raw)
    assert key in msg
    assert shown in msg


@pytest.mark.parametrize(
    ("path", "key"),
    [
        (("task",), "'task' is required"),
        (("schema", "root", "key"), "'schema.root.key' is required"),
        (("schema", "branches", 0, "parent_key"), "parent_key' is required"),
    ],
    ids=["section", "root-key", "branch-parent-key"],
)
def test_missing_key_is_named(path, key):
    raw = raw_default()
    node = raw
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]
    assert key in error_of(raw)


def test_cross_checks_name_what_is_wrong():
    raw = raw_default()
    del raw["source"]["tables"]["lineitem"]
    assert "lineitem" in error_of(raw) and "source.tables" in error_of(raw)

    raw = raw_default()
    raw["task"]["branch"] = "lines"
    assert "task.branch 'lines'" in error_of(raw)

    raw = raw_default()
    raw["model"]["d_model"] = 30
    raw["model"]["heads"] = 4
    assert "d_model (30)" in error_of(raw)


def test_branch_keys_are_named_by_branch_name(shop_spec):
    shop_spec["schema"]["branches"][0]["branches"][0]["max_length"] = 0
    assert "'schema.branches.orders.branches.lines.max_length'" in error_of(shop_spec)


def test_nested_branch_without_key_is_rejected(shop_spec):
    del shop_spec["schema"]["branches"][0]["key"]
    msg = error_of(shop_spec)
    assert "'orders'" in msg and "'key'" in msg


def test_missing_spec_file_and_bad_yaml(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_spec(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just text\n")
    with pytest.raises(UserError, match="mapping"):
        load_spec(scalar)


def test_set_overrides_are_validated_like_the_file():
    spec = load_spec(
        DEFAULT,
        ["run.batch_size=512", "model.d_model=16", "run.compile.encoders=true", "source.generate.tpch.scale=0.1"],
    )
    assert spec.run.batch_size == 512
    assert spec.model.d_model == 16
    assert spec.run.compile.encoders is True
    assert spec.source.generate.tpch.scale == 0.1


def test_set_addresses_branches_by_name():
    spec = load_spec(DEFAULT, ["lineitem.max_length=2", "lineitem.overflow=sample"])
    assert spec.schema_.branches[0].max_length == 2
    assert spec.schema_.branches[0].overflow == "sample"
    # the long form works too
    spec = load_spec(DEFAULT, ["schema.branches.lineitem.order_by.descending=true"])
    assert spec.schema_.branches[0].order_by.descending is True


def test_set_finds_a_nested_branch(shop_spec):
    raw = apply_overrides(copy.deepcopy(shop_spec), ["lines.max_length=5", "orders.max_length=4"])
    spec = parse_spec(raw)
    orders = spec.schema_.branches[0]
    assert orders.max_length == 4
    assert orders.branches[0].max_length == 5


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("run.batch_size", ["--set 'run.batch_size'", "key.path=value"]),
        ("nonsense.x=1", ["'nonsense'", "branch name"]),
        ("lineitem.max_length=-1", ["schema.branches.lineitem.max_length", "-1"]),
        ("lineitem.nope=1", ["nope", "unknown key"]),
        ("run.batch_size=lots", ["run.batch_size", "'lots'"]),
        ("run.batch_size.x=1", ["run.batch_size.x"]),
    ],
    ids=["no-equals", "unknown-section", "bad-value", "unknown-branch-key", "mistyped", "not-section"],
)
def test_bad_override_is_a_user_error_naming_it(override, names):
    with pytest.raises(UserError) as info:
        load_spec(DEFAULT, [override])
    for part in names:
        assert part in str(info.value)


def test_spec_hash_is_stable_across_key_order():
    raw = raw_default()
    reordered = {k: raw[k] for k in reversed(list(raw))}
    reordered["run"] = {k: raw["run"][k] for k in reversed(list(raw["run"]))}
    a, b = parse_spec(raw), parse_spec(reordered)
    assert a.spec_hash == b.spec_hash
    # defaults written out or left implicit describe the same workload
    explicit = copy.deepcopy(raw)
    explicit["run"]["learning_rate"] = 1e-3
    assert parse_spec(explicit).spec_hash == a.spec_hash
    changed = copy.deepcopy(raw)
    changed["run"]["batch_size"] = 512
    assert parse_spec(changed).spec_hash != a.spec_hash


def test_spec_round_trips_through_yaml(tmp_path):
    spec = load_spec(DEFAULT)
    path = tmp_path / "again.yaml"
    path.write_text(spec.to_yaml())
    again = load_spec(path)
    assert again == spec
    assert again.spec_hash == spec.spec_hash


def test_bare_off_means_off(tmp_path):
    # YAML 1.1 reads a bare `off` as false; the documented spelling must still work
    assert load_spec(DEFAULT, ["run.packing=off"]).run.packing == "off"
    raw = raw_default()
    raw["run"]["packing"] = False
    assert parse_spec(raw).run.packing == "off"
    path = tmp_path / "spec.yaml"
    path.write_text(DEFAULT.read_text().replace("packing: auto", "packing: off"))
    assert load_spec(path).run.packing == "off"


# issue 24: bounded YAML, the target/key clash, secrets in a database URL's query


def test_spec_yaml_is_read_bounded(tmp_path, shop_spec):
    from tasks.spec import MAX_SPEC_BYTES, load_yaml

    laughs = "a: &a [x, x, x]\nb: [*a, *a, *a]\n"
    with pytest.raises(UserError, match=r"YAML aliases are not allowed in a spec \('\*a' at line 2\)"):
        load_yaml(laughs, "T")
    with pytest.raises(UserError, match="nests deeper than 64 levels"):
        load_yaml("[" * 65 + "]" * 65, "T")
    assert load_yaml("[" * 64 + "]" * 64, "T") is not None
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump(shop_spec) + "#" * MAX_SPEC_BYTES)
    with pytest.raises(UserError, match="over the 1,000,000-byte limit"):
        load_spec(big)
    with pytest.raises(UserError, match="--set run.compile.options: YAML aliases are not allowed"):
        apply_overrides(dict(shop_spec), ["run.compile.options={a: &a [1], b: *a}"])


def test_an_over_long_integer_is_refused_naming_the_limit(tmp_path, shop_spec):
    """Python's 4,300-digit guard raised a bare ValueError: the CLI exited 1 ("failed:")."""
    from tasks.spec.parse import MAX_SPEC_INT_DIGITS

    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(shop_spec) + "seed_like: " + "9" * 5000 + "\n")
    with pytest.raises(UserError, match=r"integer at line \d+ is 5,000 characters long.*MAX_SPEC_INT_DIGITS"):
        load_spec(path)
    with pytest.raises(UserError, match="--set run.seed: the integer at line 1"):
        apply_overrides(dict(shop_spec), ["run.seed=0x" + "f" * MAX_SPEC_INT_DIGITS])
    assert apply_overrides(dict(shop_spec), ["run.seed=" + "9" * MAX_SPEC_INT_DIGITS])["run"]["seed"] > 0


def test_target_equal_to_a_key_is_named_as_such(shop_spec):
    bad = {**shop_spec, "task": {**shop_spec["task"], "target": shop_spec["schema"]["root"]["key"]}}
    with pytest.raises(UserError, match=r"task.target 'c_id' is schema.root.key: a key identifies rows"):
        parse_spec(bad)


@pytest.mark.parametrize(("target", "where"), [("o_id", "the key"), ("o_cust", "the parent_key")])
def test_branch_target_equal_to_a_branch_key_is_named_as_such(shop_spec, target, where):
    bad = {**shop_spec, "task": {**shop_spec["task"], "branch": "orders", "target": target}}
    with pytest.raises(
        UserError, match=rf"task.target '{target}' is {where} of branch 'orders': a key identifies"
    ) as err:
        parse_spec(bad)
    assert "set task.target to the column to predict" in str(err.value) and ".." not in str(err.value)


def test_database_url_with_a_secret_query_value_is_refused(shop_spec):
    spec = {**shop_spec, "source": {"database": {"url": "Postgresql://bob@h/db?password=hunter2"}}}
    with pytest.raises(UserError) as err:
        parse_spec(spec)
    assert "carries a password" in str(err.value) and "hunter2" not in str(err.value)


def test_set_value_that_is_not_yaml_is_named(shop_spec):
    with pytest.raises(UserError, match=r"--set run.compile.options is not valid YAML"):
        apply_overrides(dict(shop_spec), ["run.compile.options={a: [1}"])


@pytest.mark.parametrize(
    ("key", "value", "fix"),
    [
        ("min_steady_batches", 0, "set it to 1 or more"),
        ("min_steady_seconds", 0, "set it to above 0"),
        ("min_steady_seconds", -0.5, "set it to above 0"),
    ],
)
def test_a_steady_window_of_zero_is_refused_naming_the_key_and_the_fix(key, value, fix):
    # 0 let a run with no steady batch be VALID and publish compute.steady_rows_per_s 0
    raw = raw_default()
    raw["run"][key] = value
    msg = error_of(raw)
    assert f"run.{key}" in msg and fix in msg and "steady rows/s" in msg, msg
    raw["run"][key] = 1 if key == "min_steady_batches" else 0.000001  # the smallest legal values
    assert getattr(parse_spec(raw).run, key) > 0
