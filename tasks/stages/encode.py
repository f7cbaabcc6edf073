"""The ``encode`` step: the application's text encoder, outside the model, timed on its own.

The seed note: model-only timing hides the dominant cost for small contexts, "where text
encoding often takes longer than the forward pass". So text cells are turned into vectors
here, between preprocess and tensorize, and the step has its own row in the stage table
(``stage.encode.*``); request scenarios call ``encode(spec, pre)`` the same way.

Design choices:
- In place of each ``text`` column (at any depth of the nested table) the step writes a
  ``fixed_size_list<float32, run.text.dim>`` column over the same rows, so every later
  step (bucketing, loader workers, slices) carries the vectors with their rows. A null text
  cell stays a null entry (the model gives it a learned null vector); an empty string is a
  present value with its own vector.
- The encoder sees only the non-null cells of one column of one chunk, in one call: the
  default ``hashed`` encoder hashes them all at once over the Arrow buffers; a plug-in
  (``run.text.encoder: module:function``) gets them as one Arrow string array, so a real
  sentence encoder batches as it likes. No Python loop over rows anywhere in this path.
- ``hashed``: deterministic signed feature hashing (no weights, no vocabulary) of the
  lower-cased UTF-8 bytes: byte trigrams within each string plus its words (runs of bytes
  between ASCII whitespace, as ``bytes.split()``; no empty words),
  each hashed with a polynomial hash over prefix sums (uint64, wrapping), finalised with
  splitmix64, bucketed into ``dim`` slots with a sign, then L2-normalised per cell. The empty
  string has no n-grams, so it gets a dedicated one-hot slot of its own.
- A plug-in is loaded and probed (``["", "probe text"]`` must give float32 ``[2, dim]``)
  before any work; a bad path or a wrong output is a ``UserError`` (exit 2).
- Every output is checked for finite values, at the probe and on every call: a NaN or
  infinite vector is a ``UserError`` naming the encoder and the first such cell (at the
  probe, exit 2 before work; in a run, the run ends FAILED with that error) rather than an
  INVALID verdict, since no figure of a run fed NaN inputs means anything.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.measure.records import EncodeUnit
from tasks.runtime.errors import UserError
from tasks.spec import Branch, Spec
from tasks.stages.preprocess import Preprocessed

TextEncoder = Callable[[pa.Array], np.ndarray]

_P = np.uint64(0x100000001B3)  # odd, so it has an inverse modulo 2**64
_P_INV = np.uint64(pow(int(_P), -1, 2**64))
_WORD_SALT = np.uint64(0x5BD1E9955BD1E995)
_EMPTY_SLOT_SALT = 0x9E3779B97F4A7C15
_ASCII_WHITESPACE = np.frombuffer(b" \t\n\r\x0b\x0c", dtype=np.uint8)  # bytes.split()'s set


def _splitmix(h: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = h + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _powers(base: np.uint64, n: int) -> np.ndarray:
    """base**0 .. base**(n-1) modulo 2**64."""
    out = np.full(n, base, dtype=np.uint64)
    if n:
        out[0] = 1
    with np.errstate(over="ignore"):
        return np.cumprod(out, dtype=np.uint64)


def _segment_hashes(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Polynomial hash of every byte segment ``data[s:e]``, from one prefix sum (no loop)."""
    n = data.size
    with np.errstate(over="ignore"):
        weighted = data.astype(np.uint64) * _powers(_P, n)
        prefix = np.concatenate([[np.uint64(0)], np.cumsum(weighted, dtype=np.uint64)])
        shift = _powers(_P_INV, n + 1)
        lengths = (ends - starts).astype(np.uint64)
        # (prefix[e] - prefix[s]) / P**s, plus the length so "ab" and "ab\0" differ
        hashes: np.ndarray = (prefix[ends] - prefix[starts]) * shift[starts] + lengths * _P
        return hashes


def _buffers(strings: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(int64 offsets [n+1] rebased to 0, uint8 bytes) of a non-null string array."""
    arr = strings.cast(pa.large_string())
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
    buf = arr.buffers()[2]
    data = np.frombuffer(buf, dtype=np.uint8) if buf is not None else np.zeros(0, np.uint8)
    data = data[offsets[0] : offsets[-1]]
    return offsets - offsets[0], data


def hashed(strings: pa.Array, dim: int, ngram: int = 3) -> np.ndarray:
    """Default encoder: signed hashed byte n-grams + words, L2-normalised, float32 [n, dim]."""
    n = len(strings)
    lower = pc.utf8_lower(strings.cast(pa.large_string()))  # view types have no lower kernel
    offsets, data = _buffers(lower)
    lengths = np.diff(offsets)
    row_of_byte = np.repeat(np.arange(n, dtype=np.int64), lengths)
    # byte n-grams that fit inside their string
    q = np.arange(data.size, dtype=np.int64)
    ok = q + ngram <= offsets[1:][row_of_byte] if data.size else np.zeros(0, bool)
    padded = np.concatenate([data, np.zeros(ngram, np.uint8)]).astype(np.uint64)
    with np.errstate(over="ignore"):  # the same polynomial hash, fixed length: no prefix sums
        gram_hash = np.zeros(data.size, np.uint64)
        for k in range(ngram):  # over the n-gram's byte positions, not over rows
            gram_hash = gram_hash * _P + padded[k : k + data.size]
        gram_hash = gram_hash[ok] + np.uint64(ngram) * _P
    gram_row = row_of_byte[ok]
    # words: maximal runs of non-whitespace bytes within a string (bytes.split() semantics),
    # found on the byte buffer itself. Not pc.utf8_split_whitespace: in pyarrow 25 it
    # sometimes split the last string of a buffer differently (a trailing space kept in the
    # word, or an extra empty word) from one call to the next on equal arrays, so one row's
    # vector depended on memory it does not own (issue 21's output check found it).
    in_word = ~np.isin(data, _ASCII_WHITESPACE)
    first_byte = np.zeros(data.size, dtype=bool)
    first_byte[offsets[:-1][lengths > 0]] = True
    last_byte = np.zeros(data.size, dtype=bool)
    last_byte[offsets[1:][lengths > 0] - 1] = True
    prev_in = np.zeros_like(in_word)  # the byte before is in the same word
    prev_in[1:] = in_word[:-1]
    prev_in &= ~first_byte
    next_in = np.zeros_like(in_word)
    next_in[:-1] = in_word[1:]
    next_in &= ~last_byte
    w_starts = np.flatnonzero(in_word & ~prev_in)
    w_ends = np.flatnonzero(in_word & ~next_in) + 1
    word_hash = _segment_hashes(data, w_starts, w_ends) ^ _WORD_SALT
    word_row = row_of_byte[w_starts]
    h = _splitmix(np.concatenate([gram_hash, word_hash]))
    rows = np.concatenate([gram_row, word_row])
    slot = (h % np.uint64(dim)).astype(np.int64)
    sign = 1.0 - 2.0 * (h >> np.uint64(63)).astype(np.float64)
    out = np.bincount(rows * dim + slot, weights=sign, minlength=n * dim).reshape(n, dim)
    empty = lengths == 0
    out[empty, int(_splitmix(np.array([_EMPTY_SLOT_SALT], np.uint64))[0] % np.uint64(dim))] = 1.0
    norm = np.linalg.norm(out, axis=1, keepdims=True)
    return (out / np.where(norm > 0, norm, 1.0)).astype(np.float32)


@functools.lru_cache(maxsize=8)
def load_encoder(name: str, dim: int) -> TextEncoder:
    """The encoder of ``run.text.encoder``: ``hashed`` or a probed plug-in ``module:function``."""
    if name == "hashed":
        return functools.partial(hashed, dim=dim)
    module_name, _, attr = name.partition(":")
    where = f"run.text.encoder '{name}'"
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except ImportError as err:
        raise UserError(
            f"{where}: cannot import module '{module_name}' ({err}). Give an importable "
            "module (on PYTHONPATH) and a function, 'package.module:function', or "
            "use 'hashed'."
        ) from None
    except AttributeError:
        raise UserError(
            f"{where}: module '{module_name}' has no attribute '{attr}'. Name a "
            "function of that module, or use 'hashed'."
        ) from None
    if not callable(fn):
        raise UserError(
            f"{where}: '{attr}' is not callable; it must be a function taking an Arrow "
            "string array and returning a float32 matrix."
        )
    probe = pa.array(["", "probe text"], pa.string())
    try:
        out = np.asarray(fn(probe))
    except Exception as err:  # the user's code: report what it raised, as bad input
        raise UserError(
            f"{where} failed on a probe of 2 strings: {type(err).__name__}: {err}. It must "
            "take an Arrow string array and return a float32 matrix [n, dim]."
        ) from None
    if out.shape != (2, dim) or out.dtype != np.float32:
        raise UserError(
            f"{where} returned {out.dtype} {tuple(out.shape)} for 2 strings; it must "
            f"return float32 [n, run.text.dim] = [2, {dim}]. Fix the encoder or set "
            "run.text.dim to its width."
        )
    _check_finite(out, probe, where)
    encoder: TextEncoder = fn
    return encoder


def text_columns(spec: Spec) -> list[str]:
    """``node.column`` of every text column of the schema."""
    out = [f"root.{c}" for c, k in spec.schema_.root.columns.items() if k == "text"]
    return out + [f"{b.name}.{c}" for b, _ in spec.schema_.walk() for c, k in b.columns.items() if k == "text"]


def check_text(spec: Spec) -> None:
    """Before any work: a plug-in encoder must load and give the right output."""
    if text_columns(spec):
        load_encoder(spec.run.text.encoder, spec.run.text.dim)


def _check_finite(got: np.ndarray, values: pa.Array, where: str) -> None:
    """A NaN or infinite vector would enter the model as an ordinary value and silently turn
    its predictions (and quality) into NaN: refuse it, naming the encoder and a cell."""
    bad_rows = ~np.isfinite(got).all(axis=1)
    if not bad_rows.any():
        return
    first = int(np.flatnonzero(bad_rows)[0])
    text = str(values[first].as_py())
    raise UserError(
        f"{where} returned non-finite values (NaN or infinity) for {int(bad_rows.sum()):,} of "
        f"{len(values):,} text cells, first for {text[:40]!r}{'...' if len(text) > 40 else ''}; "
        "it must return finite float32 vectors (e.g. guard a division by a zero norm). Fix the "
        "encoder, or set run.text.encoder=hashed."
    )


def encode_column(
    arr: pa.Array, encoder: TextEncoder, dim: int, *, where: str = "the text encoder"
) -> pa.FixedSizeListArray:
    """A string column -> ``fixed_size_list<float32, dim>``; nulls stay null entries; a
    non-finite output is a ``UserError`` naming ``where`` (the encoder)."""
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    valid = arr.is_valid()
    values = arr.filter(valid)
    matrix = np.zeros((len(arr), dim), dtype=np.float32)
    if len(values):
        got = np.asarray(encoder(values), dtype=np.float32)
        if got.shape != (len(values), dim):
            raise UserError(
                f"the text encoder returned shape {got.shape} for {len(values)} cells; "
                f"it must return [n, {dim}] (run.text.dim)."
            )
        _check_finite(got, values, where)
        matrix[valid.to_numpy(zero_copy_only=False)] = got
    mask = arr.is_null() if arr.null_count else None
    return pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), dim, mask=mask)


@dataclass
class Encoded:
    pre: Preprocessed  # the same rows, each text column replaced by its vectors
    count: int  # what the step turned into vectors, in ``unit``
    payload: object = None  # a library's own encoding (tasks/libraries), handed to its tensorize
    rows: int | None = None  # root rows encoded, where a library encodes fewer than pre holds
    # "cells": text cells (nulls included: they are present cells), this module's encoder;
    # "strings": distinct strings and column names (relational-transformers). Each unit has
    # its own metric keys (tasks/measure/records.py ENCODE_KEYS).
    unit: EncodeUnit = "cells"

    @property
    def encoded_rows(self) -> int:
        """The encode stage row's rows: the rows this step encoded (a training chunk of a
        library that builds contexts for training rows only counts those)."""
        return self.pre.root_rows if self.rows is None else self.rows


Children = dict[str, tuple[Mapping[str, str], "Children"]]  # branch name -> (its columns, its children)


def _rebuild(
    values: pa.Table | pa.StructArray,
    columns: Mapping[str, str],
    children: Children,
    fn: Callable[[pa.Array], pa.Array],
) -> tuple[pa.Table | pa.StructArray, int]:
    """Replace text columns of one node, then recurse into its list<struct> children."""
    is_table = isinstance(values, pa.Table)
    names = values.column_names if is_table else [f.name for f in values.type]
    arrays = [values.column(i).combine_chunks() for i in range(len(names))] if is_table else values.flatten()
    cells = 0
    for i, name in enumerate(names):
        if columns.get(name) == "text":
            arrays[i] = fn(arrays[i])
            cells += len(arrays[i])
        elif name in children:
            lists = arrays[i]
            inner, n = _rebuild(lists.values, *children[name], fn)
            arrays[i] = type(lists).from_arrays(
                lists.offsets, inner, mask=lists.is_null() if lists.null_count else None
            )
            cells += n
    if is_table:
        return pa.table(dict(zip(names, arrays, strict=True))), cells
    mask = values.is_null() if values.null_count else None
    return pa.StructArray.from_arrays(arrays, names=names, mask=mask), cells


def encode(spec: Spec, pre: Preprocessed) -> Encoded:
    """The encode step: every text cell of the chunk -> a vector, by the application's encoder."""
    if not text_columns(spec):
        return Encoded(pre, 0)
    dim = spec.run.text.dim
    encoder = load_encoder(spec.run.text.encoder, dim)
    where = f"run.text.encoder '{spec.run.text.encoder}'"

    def tree(branches: list[Branch]) -> Children:
        return {b.name: (b.columns, tree(b.branches)) for b in branches if _has_text(b)}

    table, cells = _rebuild(
        pre.table,
        spec.schema_.root.columns,
        tree(spec.schema_.branches),
        lambda arr: encode_column(arr, encoder, dim, where=where),
    )
    return Encoded(replace(pre, table=table), cells)


def _has_text(branch: Branch) -> bool:
    return "text" in branch.columns.values() or any(_has_text(b) for b in branch.branches)
