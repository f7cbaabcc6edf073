"""The spec mapped onto a relflow 0.4.0 model, and the Arrow table relflow is given.

Three entry points, in the order the harness calls them:

- ``check(spec)``: refuse, before any data is read, every setting relflow cannot honour
  (``UserError``, one paragraph per refusal naming the library, the key and the fix);
- ``input_table(spec, table)``: the harness's nested table (tasks/stages/preprocess.py) as
  relflow reads it: only the model's columns plus the root key, with the Arrow types relflow
  refuses (decimals, dates as categories, ...) cast by the harness, never by the user, and
  each timestamp's trend in time added as a number;
- ``build(spec, table)``: the relflow ``Model``.

The rules, and why each refusal exists, are in this folder's README.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import pyarrow as pa
import pyarrow.compute as pc
import relflow as rf
from relflow.logging.config import configure

from tasks.libraries.relflow.checks import LIBRARY, TRAIN_COLUMN, TREND_SUFFIX, check, field_name, problems
from tasks.runtime.errors import UserError
from tasks.spec import Branch, Spec

# relflow logs at DEBUG unless RELFLOW_LOG_LEVEL says otherwise (relflow/logging/config.py),
# one stderr line per model build, checkpoint and warning path; the harness keeps a user's
# explicit setting and otherwise logs relflow's warnings only.
configure(level=os.environ.get("RELFLOW_LOG_LEVEL", "WARNING"))

__all__ = [
    "LIBRARY",
    "OVERFLOW",
    "TRAIN_COLUMN",
    "TREND_SUFFIX",
    "branch_path",
    "build",
    "check",
    "field_name",
    "input_table",
    "problems",
    "target_address",
    "trend_column",
]

OVERFLOW: dict[str, Literal["head", "tail", "error"]] = {
    "keep_first": "head",
    "keep_last": "tail",
    "error": "error",
}
# DateParts takes no default; a date has no time of day worth encoding.
_DATE_PARTS = ["day_of_week", "day_of_month", "month_of_year", "day_of_year"]
_TIME_PARTS = [*_DATE_PARTS, "hour_of_day"]
_DAY = {"s": 86_400, "ms": 86_400_000, "us": 86_400_000_000, "ns": 86_400_000_000_000}
# Model(...) and Branch(...) keyword names: spec column names go through ``fields=``, so a
# column called e.g. ``query`` or ``mask`` is a field, never an option.


def trend_column(column: str) -> str:
    """The number relflow gets beside a timestamp's date parts: days since 1970-01-01."""
    return f"{field_name(column)}{TREND_SUFFIX}"


def target_address(spec: Spec) -> str:
    """relflow's address of the target field (``/target`` or ``/branch/.../target``)."""
    return "/" + "/".join([*branch_path(spec, spec.task.branch), field_name(spec.task.target)])


def branch_path(spec: Spec, name: str | None) -> list[str]:
    """relflow's field names of the branches from the root down to branch ``name`` (none for
    the root): ``"/" + "/".join(...)`` is that branch's relflow address."""
    if name is None:
        return []
    parents = {b.name: p for b, p in spec.schema_.walk()}
    trail = [name]
    while (parent := parents[trail[0]]) is not None:
        trail.insert(0, parent)
    return [field_name(n) for n in trail]


# --- the table relflow reads -------------------------------------------------------------


def _numeric(arr: pa.Array) -> pa.Array:
    """relflow's Number accepts integers and floats only (decimals, bools refused). It encodes
    every number as float64 with a checked cast, refusing an integer beyond 2^53 ("represent
    identifiers with Hash or rescale"); the reference model and relational-transformers round
    such values, so 64-bit integers reach relflow as float64 already (unchecked: the same
    values below 2^53, rounded above). Per type, not per value, so every chunk of a column
    gets one type."""
    t = arr.type
    if pa.types.is_dictionary(t):
        return _numeric(cast(pa.DictionaryArray, arr).dictionary_decode())
    if pa.types.is_integer(t) and t.bit_width == 64:
        return pc.cast(arr, pa.float64(), safe=False)
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_null(t):
        return arr
    return pc.cast(arr, pa.float64())


def _category_type_ok(t: pa.DataType) -> bool:
    """The Arrow types relflow's Category reads (float16 has no Arrow ``unique`` kernel)."""
    return bool(
        pa.types.is_boolean(t)
        or pa.types.is_integer(t)
        or pa.types.is_float32(t)
        or pa.types.is_float64(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_null(t)
    )


def _category(arr: pa.Array) -> pa.Array:
    t = arr.type
    if pa.types.is_dictionary(t) and _category_type_ok(t.value_type):
        return arr
    if pa.types.is_dictionary(t):
        arr = cast(pa.DictionaryArray, arr).dictionary_decode()
        t = arr.type
    if _category_type_ok(t):
        return arr
    if pa.types.is_float16(t):
        return pc.cast(arr, pa.float32())
    # decimals, dates, times, durations, views: their text is the label
    return pc.cast(arr, pa.large_string())


def _epoch_days(arr: pa.Array) -> pa.Array:
    """Days since 1970-01-01 (UTC for zoned timestamps), float64: the trend date parts lose.

    The column's ticks (days, ms, or s..ns) become float64 unchecked, then days: nanoseconds
    since 1970 pass 2**53 in April 1970, and a checked cast refused every later one
    (pandas writes timestamps to Parquet in ns); float64 still holds today's to 0.2 us."""
    t = arr.type
    if pa.types.is_date32(t):
        ticks, per_day = pc.cast(arr, pa.int32()), 1
    elif pa.types.is_date64(t):
        ticks, per_day = pc.cast(arr, pa.int64()), _DAY["ms"]
    elif pa.types.is_timestamp(t):
        ticks, per_day = pc.cast(arr, pa.int64()), _DAY[cast(pa.TimestampType, t).unit]
    else:
        raise UserError(
            f"model.library relflow reads timestamp columns as dates or timestamps; got Arrow type {t}. "
            "Declare the column as category, or store it as a date/timestamp."
        )
    days = pc.cast(ticks, pa.float64(), safe=False)
    return days if per_day == 1 else pc.divide(days, float(per_day))


def _target(spec: Spec, arr: pa.Array) -> pa.Array:
    kind = spec.task.kind
    if kind == "category":
        return _category(arr)
    if kind == "binary":
        # as the reference model reads it (model/arrow.py): a cast to bool
        if pa.types.is_dictionary(arr.type):
            arr = cast(pa.DictionaryArray, arr).dictionary_decode()
        if pa.types.is_boolean(arr.type):
            return arr
        try:
            return pc.cast(arr, pa.bool_())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise UserError(
                f"task.target '{spec.task.target}' is binary but its values ({arr.type}) do not cast to "
                f"true/false ({e}); store it as bool or 0/1, or set task.kind: category."
            ) from e
    return _numeric(arr)


def _column(spec: Spec, name: str, kind: str, arr: pa.Array) -> dict[str, pa.Array]:
    """One spec column as relflow reads it: each timestamp is followed by its trend."""
    field = field_name(name)
    if kind == "numeric":
        return {field: _numeric(arr)}
    if kind == "category":
        return {field: _category(arr)}
    if kind == "timestamp":
        return {field: arr, trend_column(name): _epoch_days(arr)}
    if kind == "target":
        return {field: _target(spec, arr)}
    if kind == "branch":
        return {field: _branch_array(spec, _find_branch(spec, name), arr)}
    return {field: arr}  # text: refused by check(), never reached after it


def _find_branch(spec: Spec, name: str) -> Branch:
    return next(b for b, _ in spec.schema_.walk() if b.name == name)


def _node_items(spec: Spec, columns: Mapping[str, str], has_target: bool) -> list[tuple[str, str]]:
    return [*columns.items(), *([(spec.task.target, "target")] if has_target else [])]


def _branch_array(spec: Spec, b: Branch, lists: pa.Array) -> pa.Array:
    """A branch's ``list<struct>`` rebuilt with converted children, offsets and nulls kept."""
    if pa.types.is_null(lists.type):  # a chunk where no parent has children
        return lists
    as_list = cast(pa.ListArray | pa.LargeListArray, lists)
    # Rebased to this slice's children: Arrow rebuilds no list from sliced offsets with a
    # null bitmap, and the children outside a slice need no conversion.
    start, stop = as_list.offsets[0].as_py(), as_list.offsets[-1].as_py()
    offsets = pc.subtract(as_list.offsets, pa.scalar(start, as_list.offsets.type)) if start else as_list.offsets
    records = cast(pa.StructArray, as_list.values.slice(start, stop - start))
    children: dict[str, pa.Array] = {}
    for name, kind in _node_items(spec, b.columns, spec.task.branch == b.name):
        children.update(_column(spec, name, kind, records.field(name)))
    for child in b.branches:
        children[field_name(child.name)] = _branch_array(spec, child, records.field(child.name))
    rebuilt = pa.StructArray.from_arrays(
        list(children.values()),
        names=list(children),
        mask=records.is_null() if records.null_count else None,
    )
    build_list = pa.LargeListArray if pa.types.is_large_list(lists.type) else pa.ListArray
    return build_list.from_arrays(offsets, rebuilt, mask=lists.is_null() if lists.null_count else None)


def _chunked(spec: Spec, name: str, kind: str, column: pa.ChunkedArray) -> dict[str, pa.ChunkedArray]:
    """``_column`` chunk by chunk: no chunk is combined (a copy) on the way to relflow."""
    chunks = column.chunks or [pa.array([], column.type)]
    parts = [_column(spec, name, kind, chunk) for chunk in chunks]
    return {new: pa.chunked_array([part[new] for part in parts]) for new in parts[0]}


def input_table(spec: Spec, table: pa.Table) -> pa.Table:
    """What relflow reads: the root key (carried through ``retain``, never a field), the
    model's columns with types relflow accepts, each timestamp's trend, the target and the
    branch lists. The split flag and every other column stay out."""
    root = spec.schema_.root
    out: dict[str, pa.ChunkedArray] = {root.key: table[root.key]}
    for name, kind in _node_items(spec, root.columns, spec.task.branch is None):
        out.update(_chunked(spec, name, kind, table[name]))
    for b in spec.schema_.branches:
        out.update(_chunked(spec, b.name, "branch", table[b.name]))
    return pa.table(out)


# --- the model ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Sizes:
    heads: int
    layers: int
    dropout: float


def _leaf(kind: str, dtype: pa.DataType, sizes: _Sizes) -> dict[str, Any]:
    """The relflow field(s) for one spec column, keyed by field name suffix ('' = itself)."""
    if kind == "numeric":
        return {"": rf.Number(n_heads=sizes.heads)}
    if kind == "category":
        return {"": rf.Category(n_heads=sizes.heads)}
    parts = _DATE_PARTS if pa.types.is_date(dtype) else _TIME_PARTS
    return {"": rf.DateParts(dateparts=parts, n_heads=sizes.heads), TREND_SUFFIX: rf.Number(n_heads=sizes.heads)}


def _target_field(spec: Spec, sizes: _Sizes) -> Any:
    topk = [int(o.split(":", 1)[1]) for o in spec.task.outputs if o.startswith("topk:")]
    if spec.task.kind == "category":
        return rf.Category(mask=True, n_heads=sizes.heads, topk=topk or None)
    if spec.task.kind == "binary":
        return rf.Boolean(mask=True, n_heads=sizes.heads)
    return rf.Number(mask=True, n_heads=sizes.heads)


def _fields(
    spec: Spec, columns: Mapping[str, str], types: Mapping[str, pa.DataType], has_target: bool, sizes: _Sizes
) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for column, kind in columns.items():
        for suffix, field in _leaf(kind, _type_of(types, column), sizes).items():
            fields[field_name(column) + suffix] = field
    if has_target:
        fields[field_name(spec.task.target)] = _target_field(spec, sizes)
    return fields


def _type_of(types: Mapping[str, pa.DataType], name: str) -> pa.DataType:
    """A spec column's or branch's Arrow type in the harness's table (spec names) or in
    ``input_table``'s (relflow field names)."""
    return types.get(name) or types.get(field_name(name)) or pa.null()


def _struct_types(t: pa.DataType) -> dict[str, pa.DataType]:
    while pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    return {f.name: f.type for f in cast(pa.StructType, t)} if pa.types.is_struct(t) else {}


def _branch(spec: Spec, b: Branch, types: Mapping[str, pa.DataType], sizes: _Sizes) -> Any:
    fields = _fields(spec, b.columns, types, spec.task.branch == b.name, sizes)
    for child in b.branches:
        fields[field_name(child.name)] = _branch(spec, child, _struct_types(_type_of(types, child.name)), sizes)
    reduction = rf.Mean() if b.reduce == "mean" else rf.Attention(n_outputs=1, n_heads=sizes.heads)
    return rf.Branch(
        fields=fields,
        length=b.max_length,
        overflow=OVERFLOW[b.overflow],
        n_layers=sizes.layers,
        n_heads=sizes.heads,
        dropout=sizes.dropout,
        reduction=reduction,
        embed=f"branch_embedding:{b.name}" in spec.task.outputs,
    )


def build(spec: Spec, table: pa.Table) -> rf.Model:
    """The relflow model for ``spec``; ``table`` (the harness's nested table, or
    ``input_table``'s) gives the Arrow types that pick each timestamp's date parts."""
    check(spec)
    m = spec.model
    sizes = _Sizes(heads=m.heads, layers=m.layers, dropout=m.dropout)
    types = {f.name: f.type for f in table.schema}
    fields = _fields(spec, spec.schema_.root.columns, types, spec.task.branch is None, sizes)
    for b in spec.schema_.branches:
        fields[field_name(b.name)] = _branch(spec, b, _struct_types(_type_of(types, b.name)), sizes)
    return rf.Model(
        d_model=m.d_model,
        n_layers=m.layers,
        n_heads=m.heads,
        dropout=m.dropout,
        embed="root_embedding" in spec.task.outputs,
        fields=fields,
        batch_size=spec.run.batch_size,
    )
