"""The train/held-out split and the calibration fit/report split: a hash that is stable by
definition (hand-computed values), and the checkpoint's split record refused on mismatch."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from tasks.runtime.errors import UserError
from tasks.spec import Spec, parse_spec
from tasks.stages.split import (
    calibration_fit_rows,
    check_split,
    fnv1a64_utf8,
    key_hash64,
    split_is_train,
    split_record,
)
from tests.reference_hashes import M64 as M
from tests.reference_hashes import splitmix64 as _splitmix64


def test_fnv1a64_matches_the_published_test_vectors():
    # FNV-1a 64 reference values (Fowler/Noll/Vo test suite): "", "a", "foobar"
    got = fnv1a64_utf8(pa.array(["", "a", "foobar", None], pa.string()))
    assert [int(x) for x in got] == [0xCBF29CE484222325, 0xAF63DC4C8601EC8C, 0x85944171F73967E8, 0xCBF29CE484222325]


def test_string_keys_hash_to_hand_computed_values_and_buckets():
    keys = pl.Series(["a", "foobar"])
    want = [_splitmix64(0xAF63DC4C8601EC8C), _splitmix64(0x85944171F73967E8)]
    assert [int(x) for x in key_hash64(keys)] == want == [6857225946766476583, 6769637297169358415]
    # bucket = hash % 10000: 6583 and 8415, both >= 0.2 * 10000 -> training rows; at 0.7 'a' is held out
    assert split_is_train(keys, 0.2).to_list() == [True, True]
    assert split_is_train(keys, 0.7).to_list() == [False, True]
    # calibration: bit 32 of the hash clear -> fit, set -> report
    assert [(w >> 32) & 1 for w in want] == [0, 1]
    assert calibration_fit_rows(pa.array(["a", "foobar"])).tolist() == [True, False]


def test_integer_keys_keep_splitmix64():
    keys = pl.Series([0, 1, -1, 2**40])
    assert [int(x) for x in key_hash64(keys)] == [_splitmix64(k % M) for k in (0, 1, -1, 2**40)]


def test_vectorised_hash_equals_a_byte_loop_for_mixed_lengths_and_utf8():
    rng = np.random.default_rng(0)
    words = ["", "x", "Customer#000000001", "é", "日本語のキー", "a" * 300] + [
        "".join(chr(c) for c in rng.integers(32, 0x3000, size=int(n))) for n in rng.integers(0, 40, size=200)
    ]

    def fnv(s: str) -> int:
        h = 0xCBF29CE484222325
        for byte in s.encode():
            h = ((h ^ byte) * 0x100000001B3) % M
        return h

    arr = pa.chunked_array([pa.array(words[:50]), pa.array(words[50:])])  # chunked, and a sliced view
    assert [int(x) for x in fnv1a64_utf8(arr)] == [fnv(w) for w in words]
    sliced = pa.array(words).slice(7, 20)
    assert [int(x) for x in fnv1a64_utf8(sliced)] == [fnv(w) for w in words[7:27]]
    view = pl.Series(words).cast(pl.String)  # Polars' own string layout (string_view in Arrow)
    assert [int(x) for x in key_hash64(view)] == [_splitmix64(fnv(w)) for w in words]


def test_calibration_fit_and_report_rows_split_the_held_out_rows_about_evenly():
    keys = pl.Series([f"k{i}" for i in range(20_000)])
    held = ~split_is_train(keys, 0.5).to_numpy()
    fit = calibration_fit_rows(keys)
    assert 0.45 < fit[held].mean() < 0.55  # independent of the train/held-out split


def _with(shop_spec: dict, **task: object) -> Spec:
    return parse_spec({**shop_spec, "task": {**shop_spec["task"], **task}})


def test_check_split_refuses_another_fraction_another_hash_and_no_record(shop_spec):
    spec = _with(shop_spec, validation_fraction=0.2)
    rec = split_record(spec)
    check_split(rec, spec, "run.checkpoint 'x.ckpt'")  # same split: fine
    with pytest.raises(UserError) as err:
        check_split(rec, _with(shop_spec, validation_fraction=0.3), "run.checkpoint 'x.ckpt'")
    msg = str(err.value)
    for part in ("run.checkpoint 'x.ckpt'", "task.validation_fraction 0.2", "0.3", "task.validation_fraction=0.2"):
        assert part in msg, (part, msg)
    with pytest.raises(UserError, match="hash 'polars'"):
        check_split({**rec, "hash": "polars"}, spec, "w")
    with pytest.raises(UserError, match="does not record the train/held-out split"):
        check_split(None, spec, "w")


def test_a_split_column_is_recorded_and_weights_of_another_split_are_refused(shop_spec):
    hashed = _with(shop_spec)
    raw = {**shop_spec, "schema": {**shop_spec["schema"], "root": {**shop_spec["schema"]["root"], "split": "fold"}}}
    by_column = parse_spec(raw)
    rec = split_record(by_column)
    assert rec == {"column": "fold", "rows": by_column.schema_.root.table}
    check_split(rec, by_column, "w")
    with pytest.raises(UserError, match="split"):
        check_split(split_record(hashed), by_column, "w")  # trained on the hash split
    with pytest.raises(UserError, match="split"):
        check_split(rec, hashed, "w")
