"""The floor ledger: every stage against the plainest way this host can do the same work.

MFU says how far compute is from the machine's limit; a user pays for every stage, so each
one gets its own floor, measured on this host for the spec's data:

- **retrieve**: the source's plainest reader over the same columns (category text columns of
  Parquet dictionary-encoded, as the stage reads them) and every row group (a
  predict pass reads all of them): ``pyarrow.parquet.read_table``, Arrow IPC ``read_all``,
  the CSV reader with the spec's own source.csv settings, the database's own ``SELECT`` of the columns (DuckDB's Arrow
  output, ADBC's fetch for PostgreSQL). Bytes are counted as the stage counts them
  (``data.bytes_read``: compressed column chunks, IPC buffers, CSV file size, Arrow result).
- **tensorize**: ``torch.empty_like(t).copy_(t)`` of every tensor one chunk produces.
- **compute**: matmul FLOP/s at the model's own GEMM shapes (present coordinates of a batch
  x d_model by d_model x d_model; per-branch attention scores and values at the branch's
  mean present length: each sample root's longest present instance, the length
  ``compute.model_flops_per_s`` counts it at), not a square 1024 matmul.
- **write**: ``pyarrow.parquet.write_table`` (zstd, as the writer) of one chunk's prediction
  table into the run's output folder.
- **preprocess** (time-anchored roots only): DuckDB doing the as-of joins of one chunk (``asof_sql``).
- A library whose tensors and kernels are not the reference model's (``Library.model_floors``
  false: relflow, relational-transformers) gets no tensorize or compute floor: a memcpy of RT's
  plan indices or GEMMs at the reference model's shapes are not floors of its work. The cache key
  holds ``model.library``, so a models report never reuses another library's ledger.
- **orchestration**: one no-op Prefect task call; measured in ``flows/`` (``tasks/`` never
  imports Prefect) and handed in as a callable.

The sample (one chunk of root keys, fresh weights) goes through the plan's own ``Chain``
outside every timing. The write floor writes one chunk's prediction table: after a run, the
first chunk of rows of the run's own prediction file (the tables its write stage wrote),
else (``relflow-bench floors``, no run) the sample's predictions, served once with fresh
weights only for that (a forward pass over a chunk: seconds of a small run's overhead).
Like ``peak``, the ledger is cached per host fingerprint (and per data: files, columns,
shapes, threads) in ``$RELFLOW_CACHE_DIR``, and a ledger measured while other
processes held more than ``BUSY_HOST_FRACTION`` of the cores is used once and never cached.
``fractions`` turns a run's metrics into ``floor.<stage>.fraction`` (its rate over the floor's,
1.0 = at the floor); ``floor_trust.untrusted`` says when those stand on a floor that is not one.

Like with like: a floor is warm (best of 5 after a warm-up call), so a stage is set against it
by its warm figures, the offline predict passes after the first
(``stage.<stage>.predict.warm_seconds``, ``stage.<stage>.predict.warm_bytes``; pass 0 holds the
first calls, compilation and cold caches), and compute by ``compute.model_flops_per_s``
(present FLOPs of the steady batches). A run with one pass has no warm byte-stage figures and
gets no byte-stage fractions. A run's ledger is measured at the intra-op threads its predict
compute ran at (the flow passes ``invocation.predict_threads``, ``compute.predict.intra_op_threads``):
an ONNX Runtime session's own count, fixed when it was created, or a request run's
``run.request.intra_op_threads``, not the process's. Without a run (``relflow-bench floors``)
it is the spec's request count (``serving_threads``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import torch

from model import bucketing
from model.schema import ModelSchema
from tasks.libraries import Library, library_for
from tasks.measure import keys as K
from tasks.measure.clock import Clock, unix_time
from tasks.measure.hostload import BUSY_HOST_FRACTION, OtherCpu
from tasks.run.chain import Chain
from tasks.run.peak_flops import DTYPES, save_cache
from tasks.runtime.threads import intra_op_threads
from tasks.sources.databases import DatabaseTable, quote
from tasks.sources.tables import Sources, Table
from tasks.spec import CompileSettings, Spec
from tasks.stages.retrieve import ROOT, category_columns, dictionary_columns, list_root_keys, node_columns, retrieve
from tasks.stages.tensorize import Chunk
from tasks.stages.write import PredictionWriter

REPS = 5  # timed repetitions after one warm-up; the floor is the best one


@dataclass(frozen=True)
class Floor:
    """One stage's floor: ``amount`` (bytes, FLOPs or calls) done in ``seconds`` at best."""

    stage: str
    amount: float
    seconds: float
    how: str

    @property
    def rate(self) -> float:
        return self.amount / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Ledger:
    floors: dict[str, Floor]
    key: str
    measured_unix_s: float
    other_cpu_fraction: float
    cached: bool = False

    def metrics(self) -> dict[str, float]:
        out = {K.floor_rate(s): f.rate for s, f in self.floors.items()}
        return {**out, K.FLOOR_CACHED: float(self.cached), K.FLOOR_OTHER_CPU_FRACTION: self.other_cpu_fraction}

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "cached": False}

    @staticmethod
    def from_json(d: dict[str, Any], cached: bool) -> Ledger:
        floors = {s: Floor(**f) for s, f in d["floors"].items()}
        return Ledger(floors, d["key"], d["measured_unix_s"], d["other_cpu_fraction"], cached)


def best_seconds(step: Callable[[], object], clock: Clock, reps: int = REPS) -> float:
    """Best of ``reps`` timed calls after one warm-up call."""
    step()
    best = float("inf")
    for _ in range(reps):
        with clock.measure() as span:
            step()
        best = min(best, span.seconds)
    return best


# -- the floors -------------------------------------------------------------------------------


def _plain_read(src: Table, columns: list[str], categories: Collection[str] = ()) -> tuple[Callable[[], object], int]:
    """The plainest read of ``columns`` of every row group of ``src``, and its bytes as the
    retrieve stage counts them. ``categories`` are read dictionary-encoded where retrieve
    reads them so (Parquet text columns), so the floor produces what the stage produces."""
    if isinstance(src, DatabaseTable):
        db = src.db
        sql = f"SELECT {', '.join(quote(c) for c in columns)} FROM {quote(src.name)}"
        return (lambda: db.query(sql)), int(db.query(sql).nbytes)
    files = list(src.files)
    if src.format == "parquet":
        nbytes = 0
        for path in files:
            meta = pq.ParquetFile(path).metadata
            names = meta.schema.to_arrow_schema().names
            wanted = [names.index(c) for c in columns]
            nbytes += sum(
                meta.row_group(rg).column(i).total_compressed_size for rg in range(meta.num_row_groups) for i in wanted
            )
        dictionary = dictionary_columns(src.schema, categories)
        return (lambda: [pq.read_table(p, columns=columns, read_dictionary=dictionary) for p in files]), nbytes
    if src.format == "ipc":

        def read_ipc() -> list[pa.Table]:
            return [ipc.open_file(pa.memory_map(str(p))).read_all().select(columns) for p in files]

        return read_ipc, sum(t.nbytes for t in read_ipc())
    # CSV: the same parser settings as the checks and retrieve (source.csv: separator, quoting,
    # encoding, header, pinned types), or the floor would read another file than the stage does.
    return (lambda: [src.scan_csv(p).select(columns).collect() for p in files]), sum(p.stat().st_size for p in files)


def retrieve_floor(spec: Spec, sources: Sources, clock: Clock) -> Floor:
    """Every node's table, its columns, read plainly: bytes over the sum of best times."""
    cols, cats = node_columns(spec), category_columns(spec)
    tables = {ROOT: spec.schema_.root.table} | {b.name: b.table for b, _ in spec.schema_.walk()}
    amount, seconds, formats = 0, 0.0, set()
    for node, table in tables.items():
        src = sources[table]
        read, nbytes = _plain_read(src, cols[node], cats[node])
        amount += nbytes
        seconds += best_seconds(read, clock)
        formats.add(src.format)
    return Floor(
        "retrieve", float(amount), seconds, f"plain read ({', '.join(sorted(formats))}) of {len(tables)} tables"
    )


def asof_sql(spec: Spec) -> list[str]:
    """DuckDB statements doing the as-of work over tables registered as ``n_<node>``: per branch,
    parents first, its rows joined to the parent instances (``i_<parent>``) on the key with
    ``time <= seed time``, the newest ``max_length`` kept per parent by ``row_number()``, into
    ``i_<branch>``: the instances the next level hangs under."""
    root = spec.schema_.root
    assert root.seed_time is not None  # only time-anchored roots have this floor
    steps = [
        f"CREATE OR REPLACE TEMP TABLE i_{ROOT} AS SELECT {quote(root.key)} AS iid, "
        f"{quote(root.entity or root.key)} AS j, {quote(root.seed_time)} AS seed FROM n_{ROOT}"
    ]
    for b, parent in spec.schema_.walk():
        time = f"AND c.{quote(b.time)} <= p.seed" if b.time else ""
        order = f"c.{quote(b.order_by.column)} {'DESC' if b.order_by.descending else 'ASC'}" if b.order_by else "1"
        own = f"c.{quote(b.key)}" if b.key else "NULL"
        steps.append(
            f"CREATE OR REPLACE TEMP TABLE i_{b.name} AS SELECT row_number() OVER () AS iid, j, seed FROM ("
            f"SELECT {own} AS j, p.seed, row_number() OVER (PARTITION BY p.iid ORDER BY {order}) AS pos "
            f"FROM n_{b.name} c JOIN i_{parent or ROOT} p ON c.{quote(b.parent_key)} = p.j {time}) "
            f"WHERE pos <= {b.max_length}"
        )
    return steps


def asof_floor(spec: Spec, tables: dict[str, pa.Table], clock: Clock) -> Floor:
    """The as-of work of one chunk (``tables``: retrieve's Arrow tables of it, by node) done by
    DuckDB (``asof_sql``), without nesting into lists: rows/s of the chunk's root rows."""
    import duckdb

    con = duckdb.connect()
    for node, t in tables.items():
        con.register(f"n_{node}", t)
    steps = asof_sql(spec)

    def run() -> None:
        for sql in steps:
            con.execute(sql)

    try:
        seconds = best_seconds(run, clock)
    finally:
        con.close()
    rows = tables[ROOT].num_rows
    return Floor("preprocess", float(rows), seconds, f"DuckDB as-of joins of {len(steps) - 1} branches, one chunk")


def memcpy_floor(tensors: list[torch.Tensor], clock: Clock) -> Floor:
    """``torch.empty_like(t).copy_(t)`` of each tensor: the bytes tensorize produces, copied."""
    dst = [torch.empty_like(t) for t in tensors]

    def copy() -> None:
        for d, t in zip(dst, tensors, strict=True):
            d.copy_(t)

    amount = sum(t.nbytes for t in tensors)
    return Floor("tensorize", float(amount), best_seconds(copy, clock), f"memcpy of {len(tensors)} tensors")


def gemm_shapes(
    spec: Spec, coords_per_root: float, lengths: dict[str, int] | None = None
) -> list[tuple[int, int, int, int]]:
    """The model's own GEMMs per batch as (batch count, m, k, n): the projections and the
    feed-forward over a batch's present coordinates (one token per cell), and each node's
    attention scores (S x dh by dh x S) and values at its sequence length S (rows x tokens
    per row: one per column and one per child branch). Rows per branch are ``lengths``'s (the
    present ones, ``present_lengths``), the reserved ``max_length`` where it has none."""
    d, heads, bs = spec.model.d_model, spec.model.heads, spec.run.batch_size
    ffn = 4 * d  # model.config.ModelConfig.ffn_mult
    rows = max(int(round(bs * coords_per_root)), 1)
    shapes = [(1, rows, d, d), (1, rows, d, ffn), (1, rows, ffn, d)]

    def attention(length: int, tokens_per_row: int, instances: int) -> None:
        seq = length * max(tokens_per_row, 1)
        shapes.extend([(instances * heads, seq, d // heads, seq), (instances * heads, seq, seq, d // heads)])

    root = spec.schema_.root
    attention(1, len(root.columns) + len(spec.schema_.branches), bs)
    instances = {ROOT: bs}
    for b, parent in spec.schema_.walk():
        n = instances[parent or ROOT]
        length = max((lengths or {}).get(b.name, b.max_length), 1)
        attention(length, len(b.columns) + len(b.branches), n)
        instances[b.name] = n * length
    return shapes


def present_lengths(tz: Chunk, schema: ModelSchema | None) -> dict[str, int]:
    """Each branch's mean over the chunk's roots of its longest present instance under the
    root (what ``tasks/measure/present_flops.py`` cuts a root's branch to), rounded; empty
    where the chunk holds no encoded batch to read it from (a library's chunk: reserved)."""
    batch = getattr(tz, "batch", None)
    if schema is None or batch is None:
        return {}
    shapes = bucketing.root_shapes(batch, schema)
    return {name: int(round(float(v.mean()))) if len(v) else 0 for name, v in shapes.lengths.items()}


def compute_floor(
    spec: Spec, coords_per_root: float, device: torch.device, clock: Clock, lengths: dict[str, int] | None = None
) -> Floor:
    """Matmul FLOP/s over the model's GEMM shapes: all their FLOPs over their best times summed."""
    dtype = DTYPES[spec.run.precision]
    gen = torch.Generator(device="cpu").manual_seed(0)
    amount, seconds = 0.0, 0.0
    shapes = gemm_shapes(spec, coords_per_root, lengths)
    for g, m, k, n in shapes:
        a = torch.randn(g, m, k, generator=gen).to(device=device, dtype=dtype)
        b = torch.randn(g, k, n, generator=gen).to(device=device, dtype=dtype)
        amount += 2.0 * g * m * k * n
        seconds += best_seconds(functools.partial(torch.bmm, a, b), clock)
    return Floor("compute", amount, seconds, f"{len(shapes)} GEMM shapes, {spec.run.precision}")


def write_floor(table: pa.Table, folder: Path, clock: Clock) -> Floor:
    """``pyarrow.parquet.write_table`` of ``table`` into ``folder``; bytes are the file's."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f".floor-write-{os.getpid()}.parquet"
    try:
        seconds = best_seconds(lambda: pq.write_table(table, path, compression="zstd"), clock)
        amount = path.stat().st_size
    finally:
        path.unlink(missing_ok=True)
    return Floor("write", float(amount), seconds, f"write_table of {table.num_rows:,} rows")


class _KeepTables(PredictionWriter):
    """A writer that keeps the prediction tables in memory (the write floor's input)."""

    def __init__(self) -> None:
        super().__init__(Path(os.devnull))
        self.tables: list[pa.Table] = []

    def write(self, table: pa.Table) -> None:
        self.tables.append(table)
        self.rows += table.num_rows


def first_rows(path: Path, rows: int) -> pa.Table | None:
    """The first ``rows`` rows of a prediction file (whole row groups read, then sliced), or
    None when it holds fewer."""
    f = pq.ParquetFile(path)
    if f.metadata.num_rows < rows:
        return None
    tables, n = [], 0
    for rg in range(f.num_row_groups):
        tables.append(f.read_row_group(rg))
        n += tables[-1].num_rows
        if n >= rows:
            break
    return pa.concat_tables(tables).slice(0, rows)


# -- the ledger -------------------------------------------------------------------------------


# Bumped when a floor's definition changes, so a cached ledger of the old one is not reused
# (2: category columns read dictionary-encoded, as retrieve reads them; 3: attention at the
# present lengths, request runs at the serving threads).
DEFINITION = 3


def serving_threads(spec: Spec) -> int | None:
    """The intra-op threads a run of ``spec`` serves requests at, from the spec alone: a
    request run's ``run.request.intra_op_threads`` (None: the process's, as offline). A
    finished run passes what its predict compute really ran at instead (an ONNX Runtime
    session keeps its own: ``invocation.predict_threads``)."""
    return None if spec.run.scenario == "offline" else spec.run.request.intra_op_threads


def cache_file() -> Path:
    base = os.environ.get("RELFLOW_CACHE_DIR") or Path.home() / ".cache" / "relflow-bench"
    return Path(base) / "floors.json"


def data_key(spec: Spec, sources: Sources, device: torch.device) -> str:
    """What the floors depend on besides the host: the files (size, mtime) or database, the
    columns, the shapes, the output folder, device, precision and threads."""
    files: list[Any] = []
    for name, src in sorted(sources.items()):
        if isinstance(src, DatabaseTable):
            files.append([name, src.format, list(src.files)])
        else:
            files += [[name, str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in src.files]
    what = {
        "files": files,
        "columns": node_columns(spec),
        "dictionary": category_columns(spec),  # read dictionary-encoded: another floor
        "definition": DEFINITION,
        "lengths": {b.name: b.max_length for b, _ in spec.schema_.walk()},
        "model": [spec.model.library, spec.model.d_model, spec.model.heads],
        "run": [spec.run.batch_size, spec.run.chunk_rows, spec.run.precision, spec.run.output_dir],
        "outputs": list(spec.task.outputs),
        "device": str(device),
        "threads": torch.get_num_threads(),
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def measure(
    spec: Spec,
    sources: Sources,
    device: torch.device,
    key: str,
    orchestration: Callable[[Clock], Floor] | None = None,
    predictions: Path | None = None,
    library: Library | None = None,
) -> Ledger:
    """Every floor, now, with the share of the cores other work used meanwhile.

    ``predictions``: a finished run's prediction file (one row per root key, in key order);
    its first rows are the write floor's table when it has as many as the sample. ``library``:
    the run's model under test (``Plan.library``; None: looked up from the spec)."""
    library = library if library is not None else library_for(spec)
    clock = Clock(device)
    other = OtherCpu().start()
    floors = {"retrieve": retrieve_floor(spec, sources, clock)}
    keys, _ = list_root_keys(spec, sources)
    # The sample's engine only makes the prediction table the write floor writes: eager, so a
    # compiled spec neither compiles again here nor adds to the run's recompile bookkeeping.
    eager = spec.model_copy(update={"run": spec.run.model_copy(update={"compile": CompileSettings()})})
    chain = Chain(eager, sources, device, clock=clock, library=library)
    sample = np.asarray(keys[: spec.run.chunk_rows])
    tz = chain.prepare_untimed(sample)
    if spec.schema_.as_of:
        floors["preprocess"] = asof_floor(spec, retrieve(spec, sources, sample).tables, clock)
    if library.model_floors:  # a library's own tensors and kernels have no floor here
        floors["tensorize"] = memcpy_floor(tz.tensors(), clock)
        lengths = present_lengths(tz, chain.schema)
        floors["compute"] = compute_floor(spec, tz.coords_present / max(tz.root_rows, 1), device, clock, lengths)
    table = first_rows(predictions, len(sample)) if predictions is not None else None
    if table is None:  # no run's predictions to hand: the sample's, with fresh weights
        kept = _KeepTables()
        chain.serve(tz, kept, lambda stage, seconds, rows: None)
        if chain.engine is not None:
            chain.engine.close()
        table = pa.concat_tables(kept.tables)
    floors["write"] = write_floor(table, Path(spec.run.output_dir).resolve(), clock)
    if orchestration is not None:
        floors["orchestration"] = orchestration(clock)
    return Ledger(floors, key, unix_time(), other.stop())


def ledger(
    spec: Spec,
    sources: Sources,
    device: torch.device,
    fingerprint: str,
    orchestration: Callable[[Clock], Floor] | None = None,
    remeasure: bool = False,
    predictions: Path | None = None,
    threads: int | None = None,
    library: Library | None = None,
) -> Ledger:
    """The cached ledger for this host and data, measured on a miss (never inside a timed
    region: callers run it after theirs), at ``threads`` intra-op threads (default: the ones
    the run's predict work ran at, ``serving_threads``), which the cache key records."""
    with intra_op_threads(threads if threads is not None else serving_threads(spec)):
        return _ledger(spec, sources, device, fingerprint, orchestration, remeasure, predictions, library)


def _ledger(
    spec: Spec,
    sources: Sources,
    device: torch.device,
    fingerprint: str,
    orchestration: Callable[[Clock], Floor] | None,
    remeasure: bool,
    predictions: Path | None,
    library: Library | None,
) -> Ledger:
    key = f"{fingerprint}|{data_key(spec, sources, device)}"
    path = cache_file()
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    hit = cache.get(key)
    if not remeasure and hit is not None and (orchestration is None or "orchestration" in hit["floors"]):
        return Ledger.from_json(hit, cached=True)
    led = measure(spec, sources, device, key, orchestration, predictions, library)
    if led.other_cpu_fraction > BUSY_HOST_FRACTION:
        return led  # a busy host's floors: this run only, measured again next time
    cache[key] = led.to_json()
    save_cache(path, cache)
    return led


# -- a run against its floors -----------------------------------------------------------------


def fraction(amount: float, seconds: float, floor_rate: float) -> float:
    """A stage's rate (``amount / seconds``) over its floor's rate; 0 when either is unknown."""
    if seconds <= 0 or floor_rate <= 0:
        return 0.0
    return (amount / seconds) / floor_rate


def fractions(led: Ledger, m: dict[str, float], task_calls: int) -> dict[str, float]:
    """``floor.<stage>.fraction`` of a run's predict phase from its metrics, warm against the
    warm floors (module note), plus the floors' rates and preprocess's input rate and share.
    Stages without a warm figure (one pass, a request run's byte stages) are left out."""
    out = led.metrics()
    f = led.floors

    def warm(name: str) -> tuple[float, float]:
        """(bytes, seconds) of the stage in the passes after the first."""
        seconds = m.get(K.stage_warm_seconds(name), 0.0)
        if name == "write":  # every pass writes the same file (stage.write.predict.bytes's rule)
            return m.get(K.OUTPUT_BYTES, 0.0) * max(m.get(K.E2E_PREDICT_PASSES, 0.0) - 1, 0.0), seconds
        return m.get(K.stage_warm_bytes(name), 0.0), seconds

    for name in ("retrieve", "tensorize", "write"):
        nbytes, seconds = warm(name)
        if nbytes > 0 and seconds > 0 and name in f:
            out[K.floor_fraction(name)] = fraction(nbytes, seconds, f[name].rate)
    # compute.mfu's present FLOPs of the steady batches over their seconds (tasks/measure/
    # present_flops.py: each root row at its own shape): warm, as the floor is, in any scenario.
    flops_rate = m.get(K.compute("predict", K.MODEL_FLOPS_PER_S), 0.0)
    if flops_rate > 0 and "compute" in f:
        out[K.floor_fraction("compute")] = fraction(flops_rate, 1.0, f["compute"].rate)
    orch = m.get(K.HARNESS_ORCHESTRATION_SECONDS, 0.0)
    if task_calls > 0 and orch > 0 and "orchestration" in f:
        out[K.floor_fraction("orchestration")] = fraction(task_calls, orch, f["orchestration"].rate)
    # the as-of floor (time-anchored roots): warm root rows per second, as the floor is warm
    warm_pre = m.get(K.stage_warm_seconds("preprocess"), 0.0)
    warm_rows = m.get(K.DATA_ROWS_PREDICTED, 0.0) / max(m.get(K.E2E_PREDICT_PASSES, 0.0), 1.0)
    warm_rows *= max(m.get(K.E2E_PREDICT_PASSES, 0.0) - 1, 0.0)
    if "preprocess" in f and warm_pre > 0 and warm_rows > 0:
        out[K.floor_fraction("preprocess")] = fraction(warm_rows, warm_pre, f["preprocess"].rate)
    pre_s = m.get(K.stage_seconds("preprocess", "predict"), 0.0)
    pre_b = m.get(K.stage_bytes("preprocess", "predict"), 0.0)
    if pre_b > 0 and pre_s > 0:
        out[K.FLOOR_PREPROCESS_INPUT_BYTES_PER_S] = pre_b / pre_s
        e2e = m.get(K.E2E_PREDICT_SECONDS, 0.0)
        out[K.FLOOR_PREPROCESS_SHARE] = pre_s / e2e if e2e > 0 else 0.0
    return out
