"""MLflow's types for what a run read: Arrow types and schemas as MLflow schemas, a table's
location as an MLflow dataset source (``UrlSource`` for a database URL), and the names a user's
data puts into param, metric and tag keys as names MLflow accepts (``mlflow_name``).

The plain descriptions come from ``datasets.py``; ``writer.py`` logs them."""

from __future__ import annotations

import hashlib
import posixpath
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow
from mlflow.data.dataset_source import DatasetSource

if TYPE_CHECKING:
    import pyarrow as pa


# What MLflow accepts in a param, metric or tag key (mlflow/utils/validation.py, non-Windows):
# word characters (Unicode letters and digits, '_'), '/', '.', '-', ' ' and ':'.
_NOT_IN_MLFLOW_NAMES = re.compile(r"[^/\w.\- :]")


def mlflow_name(key: str) -> str:
    """``key`` as MLflow accepts it: unchanged when it already is; else every character MLflow
    refuses becomes ``_`` (and ``/`` too when the key would not survive path normalisation, e.g.
    ``a//b``), and ``:`` plus 8 hex digits of the original's SHA-1 keep two keys apart that
    differ only there. Keys carry column and branch names from the user's data (params
    ``schema.root.columns.<column>``, metrics ``data.orphan_rows.<branch>``): a column named
    ``Amount ($)`` must not fail the run. The spec.yaml artifact keeps the exact names."""
    clean = _NOT_IN_MLFLOW_NAMES.sub("_", key)
    norm = posixpath.normpath(clean)
    if norm != clean or norm in (".", "..") or norm.startswith(("/", "../")):
        clean = clean.replace("/", "_")
    if clean == key:
        return key
    return f"{clean}:{hashlib.sha1(key.encode()).hexdigest()[:8]}"


def dataset_source(location: str) -> Any:
    """A local path as MLflow's local source; a URL (database) as a source of its scheme."""
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source

    if "://" not in location:
        location = Path(location).resolve().as_uri()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "can be interpreted in multiple ways": all local ones agree
        try:
            return resolve_dataset_source(location)
        except mlflow.exceptions.MlflowException:
            return UrlSource(location)


def mlflow_type(t: pa.DataType) -> Any:
    import pyarrow as pa
    from mlflow.types.schema import Array, DataType, Object, Property

    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return Array(mlflow_type(t.value_type))
    if pa.types.is_struct(t):
        return Object([Property(f.name, mlflow_type(f.type)) for f in t])
    if pa.types.is_boolean(t):
        return DataType.boolean
    if pa.types.is_integer(t):
        return DataType.integer if t.bit_width <= 32 and pa.types.is_signed_integer(t) else DataType.long
    if pa.types.is_float32(t):
        return DataType.float
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return DataType.double
    if pa.types.is_temporal(t):
        return DataType.datetime
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return DataType.binary
    return DataType.string  # strings, dictionaries of strings, anything else shown as text


def mlflow_schema(schema: pa.Schema) -> Any:
    from mlflow.types.schema import ColSpec, Schema

    return Schema([ColSpec(mlflow_type(f.type), f.name) for f in schema])


class UrlSource(DatasetSource):
    """Where a table was read from when that is a database URL (password already removed)."""

    def __init__(self, url: str) -> None:
        self.url = url

    @staticmethod
    def _get_source_type() -> str:
        return "url"

    def load(self, **kwargs: Any) -> Any:
        raise mlflow.exceptions.MlflowException(
            f"{self.url} records where the benchmark read its data; read it with the database's client."
        )

    @staticmethod
    def _can_resolve(raw_source: Any) -> bool:
        return False

    @classmethod
    def _resolve(cls, raw_source: Any) -> UrlSource:
        return cls(str(raw_source))

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url}

    @classmethod
    def from_dict(cls, source_dict: dict[Any, Any]) -> UrlSource:
        return cls(source_dict["url"])
