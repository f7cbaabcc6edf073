"""Data checks before any work: what file metadata cannot show but silently breaks a run.

Run by ``flows.benchmark.plan`` after the metadata checks of ``tasks/sources/files.py``. They read
only key, target and floating-point input columns (projected, streaming Polars scans), and
either stop with a ``UserError`` (exit 2) naming the table, file, column and fix, or return
counts that the run logs as ``data.*`` metrics:

- folders: a table folder with no data files; files of one folder whose schemas differ
  (a timestamp with vs without a time zone included); a file that cannot be read (corrupt).
- keys: a branch's ``parent_key`` and the key it points at must be of one type family
  (integers of any width, or strings); rows that join no parent are counted
  (``data.orphan_rows.<branch>``) as are parents without rows
  (``data.roots_without_rows.<branch>``); a branch none of whose rows joins is refused.
- duplicate root keys (``data.duplicate_root_keys``) are refused: they would collapse.
- non-finite values in floating-point inputs (``data.non_finite.<table>.<column>``): NaN is
  read as a present null (its own learned vector, like any null); +-inf is refused, since
  it poisons the standardisation of the whole column.
- the target in ``train+predict``: at least one labelled row on each side of the
  train/validation split and two classes (category, binary) or values (regression).
- the observed maximum of rows per parent row of every branch
  (``data.observed_max_rows.<branch>``), so no more rows are reserved than the data has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from tasks.measure import keys as K
from tasks.runtime.errors import UserError
from tasks.sources.databases import DatabaseTable, quote
from tasks.sources.files import SUFFIX_FORMAT, SourceTable
from tasks.sources.tables import Sources, Table
from tasks.spec import Spec


@dataclass
class DataFacts:
    """What the checks learned: counts for the run's metrics and observed branch lengths."""

    metrics: dict[str, float] = field(default_factory=dict)
    observed_max_rows: dict[str, int] = field(default_factory=dict)  # branch -> rows per parent
    warnings: list[str] = field(default_factory=list)


def check_device_name(spec: Spec) -> None:
    """``run.device`` must name a device torch knows, before torch is asked for it."""
    import torch

    name = spec.run.device
    if name == "auto":
        return
    try:
        torch.device(name)
    except (RuntimeError, ValueError):
        raise UserError(
            f"run.device '{name}' is not a device; use auto (CUDA when present, else CPU), cpu, cuda or cuda:<index>."
        ) from None


def check_table_folders(spec: Spec, base: Path) -> None:
    """A table path that is a folder must hold data files (checked before resolving sources)."""
    for name, raw in spec.source.tables.items():
        path = Path(raw) if Path(raw).is_absolute() else base / raw
        if path.is_dir() and not any(p.suffix.lower() in SUFFIX_FORMAT for p in path.iterdir()):
            listed = sorted(p.name for p in path.iterdir())[:5]
            raise UserError(
                f"Table '{name}': folder '{path}' holds no data files (looked for "
                f"{', '.join(sorted(SUFFIX_FORMAT))}; it has "
                f"{', '.join(listed) if listed else 'nothing'}). Put the table's files there or "
                f"point source.tables.{name} at another file or folder."
            )


def _file_schema(src: SourceTable, path: Path) -> pa.Schema:
    try:
        if src.format == "parquet":
            return pq.read_schema(path)
        with pa.memory_map(str(path)) as f:
            return ipc.open_file(f).schema
    except (pa.ArrowException, OSError) as err:
        raise UserError(
            f"Table '{src.name}': file '{path}' cannot be read as {src.format} ({err}). It is "
            "corrupt or not that format: regenerate or replace it, or fix source.tables."
        ) from None


def check_files(spec: Spec, sources: Sources) -> None:
    """Every file readable; the files of one table agree on the types of the used columns."""
    used = _used_columns(spec)
    for name, src in sources.items():
        if isinstance(src, DatabaseTable) or src.format not in ("parquet", "ipc"):
            # A database checks its own storage; CSV: one set of types is inferred over all
            # files (tasks/sources/csv.py).
            continue
        first = None
        for path in src.files:
            schema = _file_schema(src, path)
            if src.format == "parquet":
                try:
                    pq.ParquetFile(path).metadata  # noqa: B018 - footer readable
                except (pa.ArrowException, OSError) as err:
                    raise UserError(
                        f"Table '{name}': file '{path}' is corrupt ({err}); regenerate or replace it."
                    ) from None
            if first is None:
                first = (path, schema)
                continue
            for col in used.get(name, ()):
                a = first[1].field(col).type if col in first[1].names else None
                b = schema.field(col).type if col in schema.names else None
                if a is not None and b is not None and not _same_type(a, b):
                    raise UserError(
                        f"Table '{name}': column '{col}' has type {a} in '{first[0].name}' but "
                        f"{b} in '{path.name}' (folder '{path.parent}'). All files of a table "
                        "must have the same column types: rewrite one of them, or point "
                        f"source.tables.{name} at files that agree."
                    )


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    family = (_family(a), _family(b))
    return a.equals(b) or (family[0] == family[1] and family[0] in ("integer", "string"))


def _family(t: pa.DataType) -> str:
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_dictionary(t):
        return _family(t.value_type)
    return str(t)


def _pl_family(t: pl.DataType) -> str:
    if t.is_integer():
        return "integer"
    if t in (pl.String, pl.Categorical) or isinstance(t, pl.Categorical | pl.Enum):
        return "string"
    return str(t)


def _used_columns(spec: Spec) -> dict[str, set[str]]:
    root = spec.schema_.root
    out: dict[str, set[str]] = {root.table: {root.key, *root.columns}}
    for b, _ in spec.schema_.walk():
        cols = {b.parent_key, *b.columns, *([b.key] if b.key else []), *([b.order_by.column] if b.order_by else [])}
        out.setdefault(b.table, set()).update(cols)
    target_table = _target_table(spec)
    out.setdefault(target_table, set()).add(spec.task.target)
    return out


def _target_table(spec: Spec) -> str:
    if spec.task.branch is None:
        return spec.schema_.root.table
    return {b.name: b for b, _ in spec.schema_.walk()}[spec.task.branch].table


def _scan(src: Table, columns: list[str]) -> pl.LazyFrame:
    """Only ``columns`` of the table, read as retrieve reads them (CSV with the pinned types
    of ``tasks/sources/csv.py``; a database table by one query)."""
    if isinstance(src, DatabaseTable):
        sql = f"SELECT {', '.join(quote(c) for c in columns)} FROM {quote(src.name)}"
        return pl.DataFrame(src.conform(src.db.query(sql))).lazy()
    files = [str(f) for f in src.files]
    if src.format == "parquet":
        lf = pl.scan_parquet(files)
    elif src.format == "ipc":
        lf = pl.scan_ipc(files)
    else:
        lf = pl.concat([src.scan_csv(Path(f)) for f in files])
    return lf.select(columns)


def _collect(src: Table, lf: pl.LazyFrame) -> pl.DataFrame:
    try:
        return lf.collect()
    except (pl.exceptions.PolarsError, OSError, pa.ArrowException) as err:
        files = ", ".join(f"'{f}'" for f in src.files[:3])
        raise UserError(
            f"Table '{src.name}' ({files}) cannot be read: {str(err).splitlines()[0]}. A file is "
            "corrupt or its columns differ: regenerate or replace it."
        ) from None


def _keys(src: Table, column: str) -> pl.Series:
    return _collect(src, _scan(src, [column])).to_series()


def check_data(spec: Spec, sources: Sources) -> DataFacts:
    """Keys, duplicates, non-finite values, target and branch lengths (see the module doc)."""
    facts = DataFacts()
    root = spec.schema_.root
    root_src = sources[root.table]
    root_keys = _keys(root_src, root.key)
    _check_duplicates(root.table, root.key, root_keys, facts)
    _check_non_finite(spec, sources, facts)
    # unique(maintain_order): the examples an error message quotes are the data's first values
    # a time-anchored root row's branches hang under its entity, which several rows share
    entities = root_keys if root.entity is None else _keys(root_src, root.entity)
    parents: dict[str | None, tuple[str, str, pl.Series]] = {
        None: (root.table, root.entity or root.key, entities.unique(maintain_order=True))
    }
    for b, parent in spec.schema_.walk():
        p_table, p_col, p_keys = parents[parent]
        child = _keys(sources[b.table], b.parent_key)
        if _pl_family(child.dtype) != _pl_family(p_keys.dtype):
            raise UserError(
                f"Branch '{b.name}' cannot join its parent: its parent_key '{b.parent_key}' "
                f"(table '{b.table}') has type {child.dtype} but the key it points at, "
                f"'{p_col}' (table '{p_table}'), has type {p_keys.dtype}. Store both "
                "as the same type (both integers or both strings) in the data."
            )
        child = child.cast(p_keys.dtype)
        joined = child.is_in(p_keys.implode())
        orphans = int((~joined).sum())
        matched = child.filter(joined)
        facts.metrics[K.orphan_rows(b.name)] = float(orphans)
        facts.metrics[K.roots_without_rows(b.name)] = float(len(p_keys) - matched.n_unique())
        if len(child) and matched.is_empty():
            raise UserError(
                f"Branch '{b.name}': none of its {len(child):,} rows joins a parent. Its "
                f"parent_key '{b.parent_key}' (table '{b.table}') holds values like "
                f"{child.head(3).to_list()} but '{p_col}' (table '{p_table}') holds "
                f"{p_keys.head(3).to_list()}. Fix the keys in the data (zero-padding, "
                "prefixes), or the branch's parent_key."
            )
        if orphans:
            facts.warnings.append(
                f"branch '{b.name}': {orphans:,} of {len(child):,} rows have "
                "no parent row and are ignored (data.orphan_rows)"
            )
        most = matched.value_counts()["count"].max()
        facts.observed_max_rows[b.name] = int(most) if isinstance(most, int | float) else 0
        facts.metrics[K.observed_max_rows(b.name)] = float(facts.observed_max_rows[b.name])
        if b.branches and b.key:  # the spec requires a key on a branch with branches
            parents[b.name] = (b.table, b.key, _keys(sources[b.table], b.key).unique(maintain_order=True))
    if spec.run.mode == "train+predict":
        _check_target(spec, sources, root_keys, facts)
    return facts


def _check_duplicates(table: str, key: str, keys: pl.Series, facts: DataFacts) -> None:
    nulls = keys.null_count()
    if nulls:  # before duplicates: n_unique counts null as one value, so nulls looked like duplicates of None
        raise UserError(
            f"Table '{table}' has {nulls:,} of {len(keys):,} rows with a null root key in '{key}': each "
            "root row needs a key to be joined and written by. Drop or fill those rows, or choose a "
            "schema.root.key column without nulls."
        )
    dupes = len(keys) - keys.n_unique()
    facts.metrics[K.DATA_DUPLICATE_ROOT_KEYS] = float(dupes)
    if dupes:
        example = keys.filter(keys.is_duplicated()).head(1).to_list()
        raise UserError(
            f"Table '{table}' has {dupes:,} duplicate root key rows in '{key}' (e.g. "
            f"{example[0]!r}): each root row needs its own key, and duplicates would silently "
            "collapse into one. De-duplicate the table, or choose a unique schema.root.key."
        )


def _check_non_finite(spec: Spec, sources: Sources, facts: DataFacts) -> None:
    numeric: dict[str, set[str]] = {}
    root = spec.schema_.root
    numeric.setdefault(root.table, set()).update(c for c, k in root.columns.items() if k == "numeric")
    for b, _ in spec.schema_.walk():
        numeric.setdefault(b.table, set()).update(c for c, k in b.columns.items() if k == "numeric")
    if spec.task.kind == "regression":
        numeric.setdefault(_target_table(spec), set()).add(spec.task.target)
    for table, cols in sorted(numeric.items()):
        src = sources[table]
        floats = [c for c in sorted(cols) if c in src.schema.names and pa.types.is_floating(src.schema.field(c).type)]
        if not floats:
            continue  # integers and decimals are always finite
        counts = _collect(
            src,
            _scan(src, floats).select(
                *[pl.col(c).is_nan().sum().alias(f"nan|{c}") for c in floats],
                *[pl.col(c).is_infinite().sum().alias(f"inf|{c}") for c in floats],
            ),
        ).row(0, named=True)
        for c in floats:
            nan, inf = int(counts[f"nan|{c}"] or 0), int(counts[f"inf|{c}"] or 0)
            facts.metrics[K.non_finite(table, c)] = float(nan + inf)
            if inf:
                raise UserError(
                    f"Column '{c}' of table '{table}' holds {inf:,} infinite values (and {nan:,} "
                    "NaN): infinities would poison its standardisation, so they are refused. "
                    "Replace them with nulls or finite values in the data, or drop the column "
                    "from the schema."
                )
            if nan:
                facts.warnings.append(f"column '{table}.{c}': {nan:,} NaN values are read as nulls (data.non_finite)")


def _check_target(spec: Spec, sources: Sources, root_keys: pl.Series, facts: DataFacts) -> None:
    from tasks.stages.preprocess import split_is_train

    task, root = spec.task, spec.schema_.root
    table = _target_table(spec)
    src = sources[table]
    target = pl.col(task.target)
    labelled = target.is_not_null()
    if pa.types.is_floating(src.schema.field(task.target).type):
        labelled = labelled & target.is_not_nan()
    if task.branch is None:
        roles = [root.key] if root.split is None else [root.key, root.split]
        df = _collect(
            src, _scan(src, [*roles, task.target]).filter(labelled).select(*map(pl.col, roles), target.alias("__t"))
        )
        if root.split is None:
            is_train = split_is_train(df[root.key], task.validation_fraction)
        else:  # the task's own split: val and test are both held out
            is_train = df[root.split].cast(pl.String) == "train"
        train, val = df.filter(is_train), df.filter(~is_train)
    else:
        df = _collect(src, _scan(src, [task.target]).filter(labelled).select(target.alias("__t")))
        train = val = df
    total = len(root_keys) if task.branch is None else src.num_rows
    distinct = train["__t"].n_unique()
    facts.metrics[K.DATA_LABELLED_ROWS] = float(len(df))
    where = f"task.target '{task.target}' (table '{table}')"
    if df.is_empty():
        raise UserError(
            f"{where} has no labelled rows: all {total:,} are null. Choose a target "
            "column with values, or label the rows."
        )
    if len(train) == 0 or len(val) == 0:
        raise UserError(
            f"{where} has {len(df):,} labelled rows of {total:,}: {len(train):,} fall in the "
            f"training split and {len(val):,} in the validation split "
            f"(task.validation_fraction {task.validation_fraction}); a run needs at least one "
            "on each side. Label more rows, or change task.validation_fraction."
        )
    if distinct < 2:
        what = "class" if task.kind != "regression" else "value"
        raise UserError(
            f"{where} has a single {what} ({train['__t'][0]!r}) in its {len(train):,} labelled "
            "training rows: there is nothing to learn. Choose another target, or data where it "
            "varies."
        )


def check_data_before_work(spec: Spec, sources: Sources) -> tuple[Spec, dict[str, float], list[str]]:
    """Every data check, then the memory estimate against the budget (``check_files`` ran
    before the metadata checks).

    Returns the spec the run uses (each branch reserving at most the data's observed
    maximum rows per parent), the ``data.*``/``memory.*`` counts to log, and warnings."""
    from tasks.backends.lengths import with_lengths
    from tasks.run.checks import memory_budget

    facts = check_data(spec, sources)
    lengths = memory_budget.reserved_lengths(spec, facts.observed_max_rows, _checkpoint_lengths(spec))
    est = memory_budget.estimate(spec, sources[spec.schema_.root.table].num_rows, lengths)
    memory_budget.check(spec, est)
    metrics = dict(facts.metrics)
    metrics.update({K.reserved_rows(b): float(n) for b, n in lengths.items()})
    metrics[K.MEMORY_ESTIMATED_CHUNK_BYTES] = float(est.chunk_bytes)
    metrics[K.MEMORY_BUDGET_BYTES] = float(est.budget_bytes)
    return with_lengths(spec, lengths), metrics, facts.warnings


def _checkpoint_lengths(spec: Spec) -> dict[str, int] | None:
    """Predict with a saved model keeps its reserved lengths (row-position embeddings): the
    checkpoint's, or the bundle's when ONNX Runtime serves one (tasks/backends/lengths.py)."""
    from tasks.backends.lengths import saved_lengths

    if spec.run.mode != "predict":
        return None
    if spec.run.checkpoint:
        path = Path(spec.run.checkpoint)
        if not path.is_file():
            return None  # load_run_checkpoint names the problem
        from model.checkpoint import load_checkpoint

        try:
            return saved_lengths(load_checkpoint(path).model.schema)
        except Exception:  # noqa: BLE001 - load_run_checkpoint reports unreadable files
            return None
    if spec.run.backend == "onnxruntime" and spec.run.onnxruntime.model:
        from tasks.backends.bundle import read_bundle

        try:
            return saved_lengths(read_bundle(Path(spec.run.onnxruntime.model)).schema)
        except UserError:  # check_backend names the problem
            return None
    return None
