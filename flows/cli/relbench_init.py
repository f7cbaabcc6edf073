"""``relflow-bench relbench-init``: a starter RelBench folder for a user's own tables.

The logic is ``tasks/datasets/relbench_starter.py``: it reads Parquet/CSV tables, infers
primary keys, foreign keys and time columns, re-indexes keys as RelBench requires (with a key
map back), and writes ``manifest.yaml`` and an example task for the user to finish.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flows.cli.common import fail, install_interrupts, out


def relbench_init_cmd(
    out_dir: Annotated[Path, typer.Argument(metavar="OUT", help="The RelBench folder to write (must not exist).")],
    table_files: Annotated[
        list[Path],
        typer.Argument(metavar="TABLE_FILE", help="Parquet or CSV files, one per table, named by the file's stem."),
    ],
    name: Annotated[str | None, typer.Option(help="Dataset name in manifest.yaml (default: OUT's name).")] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks.")] = False,
) -> None:
    """Write a starter RelBench folder (db/, manifest.yaml, an example task) from your tables."""
    install_interrupts("the temporary folder was removed; nothing was written at OUT.")
    try:
        from tasks.datasets.relbench_starter import describe, write_starter

        result = write_starter(out_dir, table_files, name)
    except Exception as err:  # noqa: BLE001
        fail(err, debug)
    for line in describe(result):
        out.print(line, highlight=False, markup=False)
