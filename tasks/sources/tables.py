"""The two kinds of table a spec names, as one type: files or a database table.

``SourceTable`` (Parquet, Arrow IPC, CSV files) and ``DatabaseTable`` (DuckDB, PostgreSQL)
share ``name``, ``format``, ``files`` (where error messages say the table lives), ``schema``
and ``num_rows``; whatever only one of them can do is reached after an ``isinstance`` check,
so the type checker sees every place that reads a database differently from files.
"""

from __future__ import annotations

from tasks.sources.databases import DatabaseTable
from tasks.sources.files import SourceTable

Table = SourceTable | DatabaseTable
Sources = dict[str, Table]
"""Table name -> its source, as the checks, the stages and the floors receive it."""
