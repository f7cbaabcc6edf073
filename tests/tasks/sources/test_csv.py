"""CSV tables as users bring them: ``source.csv`` settings, whole-file type inference, and
parse failures named up front (``tasks/sources/csv.py``, used by ``tasks/sources/files.py`` and
``tasks/stages/retrieve.py``).

The main case is a ``;``-separated pair of tables with R/pandas-style NA markers in numeric
and timestamp columns, a quoted field holding a newline and a separator, and a numeric
column whose first non-null value comes after many nulls; the test follows the values all
the way into the model tensors.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pytest

from model.schema import NULL_INDEX, RESERVED_CATEGORY_SLOTS
from tasks.runtime.errors import UserError
from tasks.sources.files import check_sources, resolve_sources
from tasks.spec import PANDAS_NULL_VALUES, parse_spec
from tasks.stages.retrieve import ROOT, list_root_keys, retrieve

PEOPLE = (
    "id;balance;segment;since;churn\n"
    '1;10.5;"north\nside";2020-01-01;yes\n'
    "2;NA;south;NA;no\n"
    '3;N/A;"a;b";2021-06-01;no\n'
    "4;-2;NULL;;yes\n"
    "5;;south;2022-12-31;no\n"
)
# visits: 'amount' is null for the first 150 rows (a 100-row inference window would read
# it as text), 'at' mixes datetimes with NaN, '#N/A' and empty cells.
VISITS_HEAD = "person;at;amount\n"


def _visits() -> str:
    rows = [f"{1 + i % 5};{'NaN' if i % 3 == 0 else '#N/A' if i % 3 == 1 else ''};NA" for i in range(150)]
    rows += ["1;2024-01-01 10:00:00;1.25", "2;NA;2.5", "3;2024-03-01 00:30:00;NA"]
    return VISITS_HEAD + "\n".join(rows) + "\n"


def _spec(csv: dict | None = None, **columns) -> dict:
    raw = {
        "name": "people",
        "source": {"tables": {"people": "people.csv", "visits": "visits.csv"}},
        "schema": {
            "root": {
                "table": "people",
                "key": "id",
                "columns": {"balance": "numeric", "segment": "category", "since": "timestamp"},
            },
            "branches": [
                {
                    "name": "visits",
                    "table": "visits",
                    "parent_key": "person",
                    "max_length": 64,
                    "overflow": "keep_last",
                    "columns": {"at": "timestamp", "amount": "numeric", **columns},
                }
            ],
        },
        "task": {"target": "churn", "kind": "category"},  # keys 1-5 all train at 0.2
        "model": {"d_model": 8, "layers": 1, "heads": 2},
        "run": {"batch_size": 4, "device": "cpu"},
    }
    if csv is not None:
        raw["source"]["csv"] = csv
    return raw


@pytest.fixture
def messy(tmp_path: Path) -> Path:
    (tmp_path / "people.csv").write_text(PEOPLE)
    (tmp_path / "visits.csv").write_text(_visits())
    return tmp_path


def test_defaults_are_pandas_na_markers():
    spec = parse_spec(_spec())
    assert spec.source.csv.null_values == list(PANDAS_NULL_VALUES)
    assert {"NA", "N/A", "NULL", "NaN", "", "#N/A", "null", "None"} <= set(spec.source.csv.null_values)
    assert spec.source.csv.separator == "," and spec.source.csv.quote_char == '"'
    assert spec.source.csv.has_header and spec.source.csv.infer_schema_rows is None


def test_na_markers_separator_and_quoted_newline_arrive_in_the_tensors(messy, prepare_chunk):
    spec = parse_spec(_spec({"separator": ";"}))
    sources = resolve_sources(spec, messy)
    check_sources(spec, sources)  # numeric with nulls is numeric; dates with NA are dates
    types = {n: str(sources["people"].schema.field(n).type) for n in ("balance", "since")}
    assert types == {"balance": "double", "since": "date32[day]"}
    assert str(sources["visits"].schema.field("amount").type) == "double"  # nulls for 150 rows first
    assert str(sources["visits"].schema.field("at").type).startswith("timestamp")

    _, enc, schema, tz = prepare_chunk(_spec({"separator": ";"}), messy)
    assert tz.keys.to_pylist() == [1, 2, 3, 4, 5]
    root = tz.batch.nodes[ROOT]
    cont = [c.name for c in schema.root.continuous]
    bal, since = cont.index("balance"), cont.index("since")

    def raw(node, j, key):  # undo the fitted standardisation
        return node.continuous[..., j].double() * enc.std[key] + enc.mean[key]

    assert root.continuous_null[:, bal].tolist() == [False, True, True, False, True]
    assert raw(root, bal, "root.balance")[[0, 3]].tolist() == pytest.approx([10.5, -2.0], abs=1e-5)
    assert root.continuous_null[:, since].tolist() == [False, True, False, True, False]
    days = [(dt.date.fromisoformat(d) - dt.date(1970, 1, 1)).days for d in ("2020-01-01", "2021-06-01", "2022-12-31")]
    assert raw(root, since, "root.since")[[0, 2, 4]].tolist() == pytest.approx(days, abs=1e-3)
    assert (root.continuous[root.continuous_null] == 0).all()

    seg = [c.name for c in schema.root.categorical].index("segment")
    vocab = enc.vocab["root.segment"]
    assert "north\nside" in vocab and "a;b" in vocab  # quoted newline and separator kept whole
    idx = root.categorical[:, seg].tolist()
    assert idx[0] == vocab.index("north\nside") + RESERVED_CATEGORY_SLOTS
    assert idx[2] == vocab.index("a;b") + RESERVED_CATEGORY_SLOTS
    assert idx[3] == NULL_INDEX  # NULL marker

    visits = tz.batch.nodes["visits"]
    vc = [c.name for c in schema.path("visits")[-1].continuous]
    amount, at = vc.index("amount"), vc.index("at")
    present = visits.present
    assert int(present.sum()) == 153
    # the 31 visits of person 1, last of them the one with values (keep_last keeps file order)
    p1 = visits.continuous_null[0][present[0]]
    assert p1[:-1, amount].all() and p1[:-1, at].all() and not p1[-1].any()
    got_amount = raw(visits, amount, "visits.amount")[0][present[0]][-1].item()
    assert got_amount == pytest.approx(1.25, abs=1e-5)
    got_at = raw(visits, at, "visits.at")[0][present[0]][-1].item()
    want = (dt.datetime(2024, 1, 1, 10) - dt.datetime(1970, 1, 1)).total_seconds() / 86_400
    assert got_at == pytest.approx(want, abs=1e-3)
    assert int((~visits.continuous_null[..., amount] & present).sum()) == 2  # 1.25 and 2.5


def test_retrieve_reads_with_the_types_the_check_pinned(messy):
    # Inference over 5 rows would call 'amount' text; the pinned whole-file schema is used
    # for every chunk, including one whose rows are all null.
    spec = parse_spec(_spec({"separator": ";"}))
    sources = resolve_sources(spec, messy)
    check_sources(spec, sources)
    keys, _ = list_root_keys(spec, sources)
    got = retrieve(spec, sources, keys[3:4])
    assert str(got.tables["visits"]["amount"].type) == "double"
    assert got.tables["visits"]["amount"].null_count == got.tables["visits"].num_rows == 30


def test_a_column_empty_in_every_row_is_read_as_its_declared_kind(tmp_path):
    """Polars types a CSV column with no value at all as text: declared numeric or timestamp,
    it failed the column check ("has type string"); now it is read as its kind, all null. A
    category stays text, and a column with one value keeps its inferred type."""
    people = "id;balance;segment;since;churn;score\n" + "".join(
        f"{i};;;NA;{'yes' if i % 2 else 'no'};\n" for i in range(1, 6)
    )
    (tmp_path / "people.csv").write_text(people.replace("1;;;NA;yes;", "1;;;NA;yes;7"))
    (tmp_path / "visits.csv").write_text(_visits())
    raw = _spec({"separator": ";"})
    raw["schema"]["root"]["columns"]["score"] = "numeric"
    spec = parse_spec(raw)
    sources = resolve_sources(spec, tmp_path)
    check_sources(spec, sources)  # raised UserError before
    keys, _ = list_root_keys(spec, sources)
    people_table = retrieve(spec, sources, keys).tables[ROOT]
    types = {c: str(people_table[c].type) for c in ("balance", "since", "segment", "score")}
    assert types == {"balance": "double", "since": "timestamp[us]", "segment": "large_string", "score": "int64"}
    assert people_table["balance"].null_count == people_table["since"].null_count == 5


def test_a_marker_outside_null_values_is_named_with_its_key(messy):
    (messy / "people.csv").write_text(PEOPLE.replace("2;NA;south", "2;?;south"))
    spec = parse_spec(_spec({"separator": ";"}))
    with pytest.raises(UserError) as err:
        check_sources(spec, resolve_sources(spec, messy))
    msg = str(err.value)
    for part in (
        "'balance'",
        "table 'people'",
        "people.csv",
        "'?'",
        "data row 2",
        "source.csv.null_values",
        "schema.root.columns.balance",
    ):
        assert part in msg, (part, msg)
    spec = parse_spec(_spec({"separator": ";", "null_values": [*PANDAS_NULL_VALUES, "?"]}))
    check_sources(spec, resolve_sources(spec, messy))  # the fix the message names works


def test_a_late_misfit_with_a_short_inference_window_fails_up_front(messy):
    spec = parse_spec(_spec({"separator": ";", "infer_schema_rows": 3}))
    (messy / "visits.csv").write_text(
        VISITS_HEAD + "1;2024-01-01;1\n2;2024-01-02;2\n1;2024-01-03;3\n1;2024-01-04;oops\n"
    )
    with pytest.raises(UserError) as err:
        check_sources(spec, resolve_sources(spec, messy))
    msg = str(err.value)
    for part in (
        "Table 'visits'",
        "visits.csv",
        "column 'amount'",
        "'oops'",
        "source.csv.null_values",
        "source.csv.infer_schema_rows",
    ):
        assert part in msg, (part, msg)


def test_wrong_separator_is_diagnosed(messy):
    spec = parse_spec(_spec())  # default ',' on a ';' file
    with pytest.raises(UserError, match=r"source.csv.separator: ';'"):
        check_sources(spec, resolve_sources(spec, messy))


def test_encoding_is_named_and_a_codec_reads_the_file(tmp_path):
    (tmp_path / "people.csv").write_bytes(PEOPLE.replace("south", "s\u00fcd").encode("latin-1"))
    (tmp_path / "visits.csv").write_text(_visits())
    spec = parse_spec(_spec({"separator": ";"}))
    with pytest.raises(UserError, match=r"Table 'people'.*people\.csv.*source\.csv\.encoding"):
        check_sources(spec, resolve_sources(spec, tmp_path))
    # a per-table encoding is not a key: the visits file is plain ASCII, valid latin-1 too
    spec = parse_spec(_spec({"separator": ";", "encoding": "latin-1"}))
    sources = resolve_sources(spec, tmp_path)
    check_sources(spec, sources)
    keys, _ = list_root_keys(spec, sources)
    got = retrieve(spec, sources, keys)
    assert "s\u00fcd" in got.tables[ROOT]["segment"].to_pylist()


def test_unclosed_quote_names_quote_char(tmp_path):
    (tmp_path / "people.csv").write_text(PEOPLE.replace('"a;b"', '"a;b'))
    (tmp_path / "visits.csv").write_text(_visits())
    spec = parse_spec(_spec({"separator": ";"}))
    with pytest.raises(UserError, match=r"Table 'people'.*source\.csv\.quote_char"):
        check_sources(spec, resolve_sources(spec, tmp_path))


def test_no_header_names_columns_by_position(tmp_path):
    (tmp_path / "people.csv").write_text(PEOPLE.split("\n", 1)[1])
    (tmp_path / "visits.csv").write_text(_visits().split("\n", 1)[1])
    raw = _spec({"separator": ";", "has_header": False})
    raw["schema"]["root"] = {
        "table": "people",
        "key": "column_1",
        "columns": {"column_2": "numeric", "column_4": "timestamp"},
    }
    raw["schema"]["branches"][0].update(parent_key="column_1", columns={"column_3": "numeric"})
    raw["task"]["target"] = "column_5"
    spec = parse_spec(raw)
    sources = resolve_sources(spec, tmp_path)
    check_sources(spec, sources)
    assert sources["people"].num_rows == 5 and sources["visits"].num_rows == 153


def test_decimal_comma(tmp_path):
    (tmp_path / "people.csv").write_text(PEOPLE.replace("10.5", "10,5"))
    (tmp_path / "visits.csv").write_text(_visits().replace("1.25", "1,25").replace("2.5", "2,5"))
    spec = parse_spec(_spec({"separator": ";"}))
    with pytest.raises(UserError, match="source.csv.decimal_comma: true"):
        check_sources(spec, resolve_sources(spec, tmp_path))
    spec = parse_spec(_spec({"separator": ";", "decimal_comma": True}))
    sources = resolve_sources(spec, tmp_path)
    check_sources(spec, sources)
    got = retrieve(spec, sources, np.array([1]))
    assert got.tables[ROOT]["balance"].to_pylist() == [10.5]


@pytest.mark.parametrize(
    ("csv", "key"),
    [
        ({"separator": ";;"}, "source.csv.separator"),
        ({"quote_char": "''"}, "source.csv.quote_char"),
        ({"encoding": "klingon"}, "source.csv.encoding"),
        ({"infer_schema_rows": 0}, "source.csv.infer_schema_rows"),
        ({"decimal_comma": True}, "decimal_comma"),
        ({"nul_values": []}, "source.csv.nul_values"),
    ],
)
def test_bad_csv_settings_name_the_key(csv, key):
    with pytest.raises(UserError, match=key.replace(".", r"\.")):
        parse_spec(_spec(csv))
