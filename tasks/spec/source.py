"""``source:``: where the tables come from (files, CSV options, a database, generated TPC-H)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from tasks.spec.base import Strict

SourceFormat = Literal["parquet", "ipc", "csv"]


class TpchSource(Strict):
    scale: float = Field(0.01, gt=0, le=1000)


class Generate(Strict):
    tpch: TpchSource


class Database(Strict):
    url: str = Field(
        description="'duckdb' (the file built from the generated TPC-H), "
        "'duckdb:<path>', or 'postgresql://user@host:port/db'; ${VAR} is read from "
        "the environment, the password best from PGPASSWORD"
    )


# What pandas.read_csv reads as missing by default (its ``na_values`` defaults), so a CSV
# that opens cleanly in pandas or R opens the same way here.
PANDAS_NULL_VALUES = (
    "",
    "#N/A",
    "#N/A N/A",
    "#NA",
    "-1.#IND",
    "-1.#QNAN",
    "-NaN",
    "-nan",
    "1.#IND",
    "1.#QNAN",
    "<NA>",
    "N/A",
    "NA",
    "NULL",
    "NaN",
    "None",
    "n/a",
    "nan",
    "null",
)


class CsvOptions(Strict):
    """How CSV tables are read: the same settings in the up-front checks and in retrieve."""

    null_values: list[str] = Field(
        default_factory=lambda: list(PANDAS_NULL_VALUES),
        description="cells read as null in every column (replaces the default list: pandas' default NA markers)",
    )
    separator: str = Field(",", description="one single-byte character, e.g. ';' or '\\t'")
    quote_char: str | None = Field('"', description="null: quotes are ordinary characters")
    encoding: str = Field(
        "utf8", description="utf8, utf8-lossy, or any Python codec (e.g. latin-1, cp1252: decoded in memory)"
    )
    has_header: bool = Field(True, description="false: columns are named column_1, column_2, ...")
    infer_schema_rows: int | None = Field(
        None, gt=0, description="rows read to infer column types; null = the whole file"
    )
    decimal_comma: bool = Field(False, description="numbers written 1,5 (needs separator != ',')")

    @field_validator("separator")
    @classmethod
    def _one_byte(cls, v: str) -> str:
        if len(v.encode()) != 1:
            raise ValueError("must be exactly one single-byte character, e.g. ',' ';' '|' or a tab")
        return v

    @field_validator("quote_char")
    @classmethod
    def _one_byte_quote(cls, v: str | None) -> str | None:
        if v is not None and len(v.encode()) != 1:
            raise ValueError("must be one single-byte character (or null for no quoting)")
        return v

    @field_validator("encoding")
    @classmethod
    def _known_codec(cls, v: str) -> str:
        import codecs

        if v not in ("utf8", "utf8-lossy"):
            try:
                codecs.lookup(v)
            except LookupError:
                raise ValueError(
                    "unknown encoding; use utf8, utf8-lossy or a Python codec name such as latin-1 or cp1252"
                ) from None
        return v

    @model_validator(mode="after")
    def _comma_clash(self) -> CsvOptions:
        if self.decimal_comma and self.separator == ",":
            raise ValueError("decimal_comma needs a separator other than ','")
        return self


class RelBench(Strict):
    """A RelBench dataset folder and one of its tasks (tasks/spec/relbench.py)."""

    path: str = Field(
        description="the dataset folder (manifest.yaml, db/, tasks/); relative paths resolve against the "
        "generated data folder when source.generate is set ('rel-tpch' is generated there), else the spec's folder"
    )
    task: str = Field(description="a task folder name under <path>/tasks/")


class Source(Strict):
    relbench: RelBench | None = Field(
        None,
        description="read a RelBench folder: the task's rows are the root rows (entity, seed time, label), "
        "its tables the branches; schema and task are derived unless given",
    )
    database: Database | None = Field(None, description="read the schema's tables from this database instead of files")
    tables: dict[str, str] = Field(
        default_factory=dict,
        description="table name -> path (Parquet/IPC/CSV); relative paths resolve against "
        "the data folder when generated, else the spec's folder",
    )
    format: SourceFormat | None = Field(None, description="default: from the file suffix")
    csv: CsvOptions = Field(default_factory=CsvOptions)
    generate: Generate | None = None

    @model_validator(mode="after")
    def _no_password_in_url(self) -> Source:
        # The spec travels to Prefect, MLflow params and spec.yaml: a password must not.
        from tasks.runtime.masking import literal_password, mask_secrets

        if self.database is not None and literal_password(self.database.url):
            raise ValueError(
                f"source.database.url {mask_secrets(self.database.url)} carries a password; "
                "remove it and export PGPASSWORD (or write ${VAR} in the URL and export VAR)"
            )
        return self
