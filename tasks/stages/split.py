"""Which root rows are held out, and which held-out rows fit the calibration: by root key,
with a hash that is stable by definition (the same key lands on the same side on every
machine, Python, Polars and PyArrow version).

``key_hash64(keys)`` (uint64 per key):

- integer keys: splitmix64's finaliser of the key as a 64-bit two's-complement integer
  (``z += 0x9E3779B97F4A7C15``, then ``z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
  z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31``, all mod 2^64);
- string keys (and any other type, over its Polars string form): FNV-1a 64 over the key's
  UTF-8 bytes (offset basis ``0xCBF29CE484222325``, prime ``0x100000001B3``), then the same
  splitmix64 finaliser (FNV's low bits mix poorly, and the split reads ``hash % 10000``).
  A null key hashes as the empty string.

Polars' own ``Series.hash`` was used for strings before; Polars does not promise it stays
the same across versions, so a checkpoint's held-out rows could silently include rows it
trained on after an upgrade.

- ``split_is_train``: a root row trains when ``hash % 10000 >= round(validation_fraction *
  10000)``; otherwise it is held out (quality is scored there).
- ``calibration_fit_rows``: held-out rows whose hash has bit 32 clear fit the temperature
  (``calibration.fit_rows``); the others, with bit 32 set, report ``quality.nll|ece|brier``
  (``calibration.report_rows``), so calibration quality is never scored on the rows it was
  fitted on. Bit 32 is independent of ``hash % 10000`` for a well-mixed hash.

The checkpoint records ``split_record(spec)``; ``check_split`` refuses a predict, resume or
reference run whose split differs (held-out rows would include training rows). The run's
``run.seed`` does not enter the split, so it is not compared.

Vectorised: strings are hashed one byte position at a time over every key that long
(keys sorted by length, so each step is a prefix), never a Python loop over rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tasks.runtime.errors import UserError
from tasks.spec import Spec

TRAIN = "__train"
FIT = "__fit"  # held-out rows the output calibration's temperature is fitted on
SCORED = "__scored"  # held-out rows quality.* is computed on
SPLIT_HASH = "splitmix64(int) | fnv1a64-utf8+splitmix64(str), v1"
SPLIT_BUCKETS = 10_000
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_CALIBRATION_BIT = np.uint64(32)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        out: np.ndarray = z ^ (z >> np.uint64(31))
    return out


def fnv1a64_utf8(strings: pa.Array) -> np.ndarray:
    """FNV-1a 64 of each string's UTF-8 bytes (uint64), vectorised over byte positions."""
    arr = pc_large_binary(strings)
    n = len(arr)
    h = np.full(n, _FNV_OFFSET, dtype=np.uint64)
    if n == 0:
        return h
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64)[arr.offset : arr.offset + n + 1]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.empty(0, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    if arr.null_count:  # a null slot may still span bytes in some producers: hash it as ""
        valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        lengths = np.where(valid, lengths, 0)
    order = np.argsort(-lengths, kind="stable")  # longest first: each byte step is a prefix
    s_start, s_len = starts[order], lengths[order]
    hs = h[order]
    longest = int(s_len[0]) if n else 0
    # active[j] = how many keys have more than j bytes
    active = np.searchsorted(-s_len, -np.arange(longest), side="left")
    pos = s_start.copy()
    with np.errstate(over="ignore"):
        for j in range(longest):  # byte positions, not rows; in place on the active prefix
            k = int(active[j])
            h_k, pos_k = hs[:k], pos[:k]
            np.bitwise_xor(h_k, data[pos_k], out=h_k, casting="unsafe")
            np.multiply(h_k, _FNV_PRIME, out=h_k)
            pos_k += 1
    h[order] = hs
    return h


def pc_large_binary(strings: pa.Array | pa.ChunkedArray) -> pa.LargeBinaryArray:
    """One contiguous large_binary array of the strings' UTF-8 bytes (a cast, no copy of rows
    through Python)."""
    if isinstance(strings, pa.ChunkedArray):
        strings = strings.combine_chunks()
    if pa.types.is_string_view(strings.type):
        strings = strings.cast(pa.large_string())
    out: pa.LargeBinaryArray = strings.cast(pa.large_binary())
    return out


def key_hash64(keys: pl.Series) -> np.ndarray:
    """The stable uint64 hash of each root key (module docstring)."""
    if keys.dtype.is_integer():
        return _splitmix64(keys.cast(pl.Int64).to_numpy().astype(np.uint64))
    text = keys if keys.dtype == pl.String else keys.cast(pl.String)
    return _splitmix64(fnv1a64_utf8(text.to_arrow()))


def split_is_train(keys: pl.Series, validation_fraction: float) -> pl.Series:
    """``True`` for training rows, ``False`` for held-out ones (deterministic by key)."""
    bucket = key_hash64(keys) % np.uint64(SPLIT_BUCKETS)
    return pl.Series(TRAIN, bucket >= np.uint64(round(validation_fraction * SPLIT_BUCKETS)))


def split_roles(spec: Spec, table: pl.DataFrame) -> list[pl.Series]:
    """``__train``, ``__fit`` and ``__scored`` for a chunk's root rows.

    With ``schema.root.split`` (a time-anchored task's RelBench split), 'train' rows train, 'val'
    rows fit the calibration and 'test' rows are scored: quality is the test split's. Otherwise the
    stable key hash: held-out rows are scored, and those with bit 32 clear also fit the
    temperature (calibration quality is reported on the others, ``report_rows``)."""
    root = spec.schema_.root
    if root.split is not None:
        split = table[root.split].cast(pl.String)
        return [
            (split == s).fill_null(False).alias(name) for s, name in (("train", TRAIN), ("val", FIT), ("test", SCORED))
        ]
    keys = table[root.key]
    train = split_is_train(keys, spec.task.validation_fraction)
    fit = pl.Series(FIT, calibration_fit_rows(keys)) & ~train
    return [train, fit.alias(FIT), (~train).alias(SCORED)]


def role_masks(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, fit, scored) bool per row of a preprocessed table (``split_roles``' columns)."""
    out = tuple(np.asarray(table[c].to_numpy(zero_copy_only=False), dtype=bool) for c in (TRAIN, FIT, SCORED))
    return out[0], out[1], out[2]


def with_train(table: pa.Table, train: pa.Array | list[bool], key: str) -> pa.Table:
    """``table`` (preprocessed) with a chosen train mask, its held-out rows scored and fitting the
    calibration by the key hash as usual: the roles a hand-picked split implies (tests, tools)."""
    is_train = pa.array(train, pa.bool_()) if isinstance(train, list) else train
    held = pc.invert(is_train)
    fit = pa.array(calibration_fit_rows(table[key]))
    roles = {TRAIN: is_train, SCORED: held, FIT: pc.and_(held, fit)}
    for name, column in roles.items():
        table = table.set_column(table.schema.get_field_index(name), name, column)
    return table


def calibration_fit_rows(keys: pa.Array | pa.ChunkedArray | pl.Series) -> np.ndarray:
    """bool per key: ``True`` where a held-out row fits the temperature, ``False`` where it
    reports calibration quality (meaningful only for held-out rows)."""
    series = keys if isinstance(keys, pl.Series) else pl.Series(keys)
    bit: np.ndarray = (key_hash64(series) >> _CALIBRATION_BIT) & np.uint64(1)
    fit: np.ndarray = bit == np.uint64(0)
    return fit


def split_record(spec: Spec) -> dict[str, Any]:
    """What a checkpoint records about the rows it trained on: the key hash and fraction, or the
    split column and where its rows come from (a RelBench folder's task)."""
    root, rb = spec.schema_.root, spec.source.relbench
    if root.split is not None:
        return {"column": root.split, "rows": f"{rb.path}:{rb.task}" if rb else root.table}
    return {"validation_fraction": float(spec.task.validation_fraction), "hash": SPLIT_HASH}


def check_split(saved: dict[str, Any] | None, spec: Spec, what: str) -> None:
    """Refuse weights trained on another train/held-out split than the spec's."""
    if saved is None:
        raise UserError(
            f"{what} does not record the train/held-out split it was trained with (it was written "
            "before relflow-bench recorded it), so its held-out rows cannot be shown to exclude "
            "its training rows; train a new checkpoint with run.mode=train+predict."
        )
    want = split_record(spec)
    if "column" in want or "column" in saved:
        if saved != want:
            raise UserError(
                f"{what} was trained on the split {saved}, the spec's is {want}: its training rows may "
                "fall among the scored rows; use the same task (source.relbench, schema.root.split) or "
                "train a new checkpoint with run.mode=train+predict."
            )
        return
    if saved.get("hash") != want["hash"]:
        raise UserError(
            f"{what} split its rows with hash '{saved.get('hash')}', this version uses "
            f"'{want['hash']}': its training rows may fall among the held-out rows; train a new "
            "checkpoint with run.mode=train+predict."
        )
    if saved.get("validation_fraction") != want["validation_fraction"]:
        raise UserError(
            f"{what} was trained with task.validation_fraction {saved.get('validation_fraction')}, "
            f"the spec has {spec.task.validation_fraction}: the held-out rows would include rows it trained on. "
            f"Set --set task.validation_fraction={saved.get('validation_fraction')}, or train a new "
            "checkpoint with this fraction."
        )
