"""Embedded default data: TPC-H tables generated locally with ``tpchgen-cli``.

Generated once per scale factor into ``$RELFLOW_DATA_DIR`` (default ``./data``) and reused.
Generation writes into a temporary folder and renames it into place, so an interrupted
run never leaves a half-written data set that a later run would trust.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tasks.runtime import interrupts
from tasks.runtime.errors import UserError

TPCH_TABLES = ("customer", "lineitem", "nation", "orders", "part", "partsupp", "region", "supplier")


def data_dir() -> Path:
    return Path(os.environ.get("RELFLOW_DATA_DIR", "data")).resolve()


def tpch_dir(scale: float, root: Path | None = None) -> Path:
    return (root or data_dir()) / "tpch" / f"sf{scale:g}"


def ensure_tpch(scale: float, root: Path | None = None) -> tuple[Path, bool]:
    """Return the folder holding TPC-H Parquet at ``scale`` and whether it was generated now."""
    target = tpch_dir(scale, root)
    if all((target / f"{t}.parquet").is_file() for t in TPCH_TABLES):
        return target, False
    exe = shutil.which("tpchgen-cli")
    if exe is None:
        raise UserError(
            "tpchgen-cli is not installed, so TPC-H data cannot be generated; run "
            "'python -m pip install -e .' (it is a dependency) or point source.tables at files."
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".sf{scale:g}-", dir=target.parent))
    # removed however this ends, a signal included (interrupts.py also stops tpchgen-cli)
    with interrupts.removed_on_exit(lambda: shutil.rmtree(tmp, ignore_errors=True)):
        try:
            subprocess.run(
                [exe, "parquet", "-s", f"{scale:g}", "--output-dir", str(tmp)],
                check=True,
                capture_output=True,
                text=True,
            )
        except subprocess.CalledProcessError as err:
            raise UserError(f"tpchgen-cli failed for scale {scale:g}: {err.stderr.strip()}") from None
        if all((target / f"{t}.parquet").is_file() for t in TPCH_TABLES):
            return target, False  # another process finished first and may be reading it
        if target.exists():  # an incomplete folder from before: replace it
            shutil.rmtree(target)
        tmp.rename(target)
    return target, True
