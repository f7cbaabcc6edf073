"""relational-transformers 0.1.0 inside the harness's chain: its encode and tensorize steps
and its engine.

The harness reads and preprocesses (one nested Arrow row per root key); then, per chunk:

- **encode** (its own stage row: the application's cell encoding, which the library leaves
  to the application) = ``build_contexts`` (cells, node ids, parent links, normalisation
  with the training split's statistics: fitted on the first chunk's ``__train`` rows, or
  read from the checkpoint) + ``contexts.encode`` (each distinct string and column name ->
  a 384-wide vector: it counts strings, ``data.strings_encoded`` and ``encode.strings_per_s``,
  not cells). A training chunk builds contexts for its training rows only, so held-out rows
  never reach a training step.
- **tensorize** = the batch plan, ``run.batch_size`` contexts per batch, by ``plan_batches``
  (``run.bucketing: by_length`` groups similar context lengths; training shuffles with the
  run's seed and the epoch), and its present cells (``data.coords_present``; no reserved
  layout, so no ``data.coords_reserved`` / ``data.occupancy``: the padded cells are counted
  from the batches compute serves, ``data.padded_coords``). The first chunk also builds the
  model (``RTDriver.from_spec``), inside that step's time as the reference model's first fit
  is; ``run.checkpoint`` loads it when the side is made instead.
- **compute** = each planned batch collated into the library's ``RelationalBatch`` as it is
  served (compute's wait for input, as the reference model's batch slicing is; its seconds
  are ``compute[.train].library_collate_seconds``), then ``RTDriver.train_step`` / ``scores``
  in the harness's clocked loop (``LibraryEngine``). Collating every batch of a chunk up front
  held them all at once (the default workload's predict peaked at 3.8 GB); served, one batch
  lives at a time. ``run.backend: onnxruntime`` exports the trained model
  through the library's exporter on the first predict-mode batch (the calibration fit's in
  train+predict, untimed; else the first call of predict) and serves the library's ONNX
  backend with the spec's providers and threads (0 = torch's thread count).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import polars as pl
import pyarrow as pa
import torch
from relational_transformers import RelationalBatch

from model.batch import UNSEEN_CLASS
from tasks.libraries.base import OwnInputs
from tasks.libraries.engine import LibraryChunk, LibraryEngine, binary_probability
from tasks.libraries.relational_transformers.checks import LIBRARY
from tasks.libraries.relational_transformers.contexts import (
    TRAIN_COLUMN,
    Contexts,
    Stats,
    build_contexts,
    collate,
    encode,
    fit_stats,
    plan_batches,
    planned_cells,
    unseen_classes,
)
from tasks.libraries.relational_transformers.contexts import Encoded as CellVectors
from tasks.libraries.relational_transformers.driver import OnnxDriver, RTDriver, first_cell
from tasks.libraries.relational_transformers.graph_contexts import (
    AssemblyFigures,
    GraphStore,
    TextCache,
    graph_tables,
    relbench_folder,
    spec_graph_tables,
    stats_for,
)
from tasks.measure import keys as K
from tasks.measure.clock import Clock, wall_clock
from tasks.sources.relbench import read_all
from tasks.sources.tables import Sources
from tasks.spec import Spec
from tasks.stages.encode import Encoded
from tasks.stages.engine import EngineBase, ModelFacts
from tasks.stages.preprocess import Preprocessed
from tasks.stages.split import role_masks, split_roles

__all__ = ["RTSide"]


def _rtu_version() -> str:
    import importlib.metadata as md

    return md.version("relational-transformers-utils")


@dataclass
class _Encoding:
    """What the encode step hands to tensorize: contexts, their vectors, and which chunk row
    each context is (a training chunk holds its training rows only)."""

    contexts: Contexts
    vectors: CellVectors
    rows: torch.Tensor  # chunk row of context i


@dataclass
class _Part:
    """One device batch: the library's batch, the chunk rows it holds (batch order), labels."""

    batch: RelationalBatch
    rows: torch.Tensor
    labels: torch.Tensor
    present: torch.Tensor


@dataclass
class _Collated:
    """A chunk's library inputs: the encoding and tensorize's batch plan over it (each batch
    is collated when compute serves it)."""

    encoding: _Encoding
    plan: list[np.ndarray]  # context positions per batch, in the plan's order
    sorted_rows: torch.Tensor  # the chunk rows the plan covers, sorted (to recognise a request)


def _train_mask(table: pa.Table) -> np.ndarray:
    column = table[TRAIN_COLUMN].combine_chunks().fill_null(False)
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=bool)


def _rows_of_contexts(table: pa.Table, train: bool) -> tuple[pa.Table, torch.Tensor]:
    if not train:
        return table, torch.arange(table.num_rows)
    rows = np.flatnonzero(_train_mask(table))
    return table.take(pa.array(rows)), torch.from_numpy(rows.astype(np.int64))


class RTSide(OwnInputs):
    """The ``ModelSide`` (tasks/libraries/base.py) of one run over relational-transformers."""

    encodes = True  # the library never sees strings: the application's encode step, its own row

    def __init__(self, spec: Spec, device: torch.device) -> None:
        self.spec, self.device = spec, device
        self.driver: RTDriver | None = None
        self.stats: Stats | None = None
        self.epoch = 0
        # model.rt.context.builder rt_utils: the library's store over the sources (built on the
        # first encode, inside that step's time), its figures and the text cache
        self.builder = spec.model.rt.context.builder
        self.sources: Sources | None = None
        self.graph: GraphStore | None = None
        self.figures = AssemblyFigures()
        self.text = TextCache()
        if spec.run.checkpoint:  # a missing path is a UserError naming it (exit 2), before any work
            self.driver = RTDriver.from_spec(spec, checkpoint=spec.run.checkpoint, device=device)
            self.stats = self.driver.stats

    def read_sources(self, sources: Sources) -> None:
        self.sources = sources

    def _graph(self) -> GraphStore:
        if self.graph is None:
            if self.sources is None:
                raise RuntimeError("the rt_utils builder needs the run's sources (Chain.read_sources)")
            t0 = wall_clock()
            if self.spec.source.relbench is not None:
                g = graph_tables(self.spec, relbench_folder(self.spec, self.sources), self._read)
            else:  # the spec's own schema: root rows as the task, branches by their keys
                g = spec_graph_tables(self.spec, self._read, self._train_of)
            self.figures.store_seconds += wall_clock() - t0  # reading the tables; the store adds its own
            self.graph = GraphStore(self.spec, g, self.figures)
        return self.graph

    def _read(self, name: str, columns: list[str]) -> pa.Table:
        assert self.sources is not None
        return read_all(self.sources[name], columns).to_arrow()

    def _train_of(self, rows: pa.Table) -> np.ndarray:
        """The harness's split of whole root rows (the chunks' ``__train``)."""
        train = split_roles(self.spec, cast(pl.DataFrame, pl.from_arrow(rows)))[0]
        return np.asarray(train.to_numpy(), dtype=bool)

    def encode(self, pre: Preprocessed, train: bool) -> Encoded:
        if self.builder == "rt_utils":
            return self._encode_graph(pre, train)
        if self.stats is None:  # the first chunk: the training split's statistics
            self.stats = fit_stats(pre.table, self.spec)
        table, rows = _rows_of_contexts(pre.table, train)
        contexts = build_contexts(table, self.spec, self.stats)
        vectors = encode(contexts)
        # it counts strings (each distinct value and column name once), not cells: its own keys
        return Encoded(
            pre, vectors.strings_encoded, _Encoding(contexts, vectors, rows), rows=int(rows.numel()), unit="strings"
        )

    def _encode_graph(self, pre: Preprocessed, train: bool) -> Encoded:
        """The rt_utils builder: the library assembles each context over the whole graph, anchored
        at the row's seed time; its text through the library's CachedEncoder."""
        graph = self._graph()
        if self.stats is None:  # the target's classes or scale from the first chunk, scales from the graph
            self.stats = stats_for(fit_stats(pre.table, self.spec), graph)
        table, rows = _rows_of_contexts(pre.table, train)
        contexts = graph.contexts(table, self.stats, predict=not train)
        vectors = encode(contexts, self.text)
        return Encoded(
            pre, vectors.strings_encoded, _Encoding(contexts, vectors, rows), rows=int(rows.numel()), unit="strings"
        )

    def tensorize(self, pre: Preprocessed, train: bool, encoded: Encoded | None) -> LibraryChunk:
        spec, run = self.spec, self.spec.run
        assert encoded is not None and isinstance(encoded.payload, _Encoding), "the chain runs encode first"
        enc = encoded.payload
        if self.driver is None:  # the first chunk: the model, sized by the spec, fresh weights
            assert self.stats is not None
            self.driver = RTDriver.from_spec(spec, self.stats, device=self.device)
        n = pre.root_rows
        # the plan shuffles training batches anew each epoch, reproducibly from the run's seed
        seed = run.seed * 1_000_003 + self.epoch if train else None
        plan = plan_batches(enc.contexts.lengths, run.batch_size, run.bucketing, run.bucket_count, seed)
        cells, _ = planned_cells(enc.contexts.lengths, plan)
        labels, present = torch.zeros(n), torch.zeros(n, dtype=torch.bool)
        all_labels, all_present = enc.contexts.label_tensors(np.arange(enc.contexts.count))
        if spec.task.kind == "regression":  # contexts hold training-normalised values; quality
            # compares predictions in the target's units (predict_step), so the chunk does too
            assert self.stats is not None
            all_labels = torch.where(all_present, all_labels * self.stats.target_std + self.stats.target_mean, 0.0)
        labels[enc.rows], present[enc.rows] = all_labels, all_present
        if spec.task.kind == "category":  # a class the training split never had: scored as wrong
            assert self.stats is not None
            labels[torch.from_numpy(unseen_classes(pre.table, spec, self.stats))] = UNSEEN_CLASS
        train_rows, fit, scored = role_masks(pre.table)
        return LibraryChunk(
            keys=pre.table[spec.schema_.root.key].combine_chunks(),
            is_train=torch.from_numpy(train_rows),
            is_fit=torch.from_numpy(fit),
            is_scored=torch.from_numpy(scored),
            labels=labels,
            label_present=present,
            coords_present=cells,
            # No reserved layout: each batch is padded to its own longest context, so the
            # padded cells are what compute's batches materialise (data.padded_coords and
            # data.batch_occupancy.*), never data.coords_reserved / data.occupancy.
            coords_reserved=None,
            root_rows=n,
            encoded_rows=int(enc.rows.numel()),  # a training chunk's contexts: its training rows
            inputs=_Collated(enc, plan, torch.sort(enc.rows).values),
            input_tensors=[torch.from_numpy(idx) for idx in plan],  # what tensorize produced: the plan
        )

    def builder_tags(self) -> dict[str, str]:
        c = self.spec.model.rt.context
        if self.builder != "rt_utils":
            return {"relflow.library_context_builder": "nested (the harness's nested row)"}
        seed = c.seed if c.seed is not None else self.spec.run.seed
        anchor = "each row's seed time" if self.spec.schema_.root.seed_time else "none: no seed time, every row"
        return {
            "relflow.library_context_builder": (
                f"rt_utils (relational-transformers-utils {_rtu_version()}, seed {seed}, anchor {anchor})"
            )
        }

    def builder_metrics(self) -> dict[str, float]:
        """The rt_utils builder's figures (tasks/measure/keys.py RT_CONTEXT_*); none for nested."""
        if self.builder != "rt_utils":
            return {}
        f = self.figures
        cells = np.concatenate(f.cells) if f.cells else np.zeros(0, np.int64)
        out = {
            K.RT_CONTEXT_STORE_SECONDS: f.store_seconds,
            K.RT_CONTEXT_ASSEMBLY_SECONDS: f.assembly_seconds,
            K.RT_CONTEXT_CELLS_SECONDS: f.cells_seconds,
            K.RT_CONTEXT_TEXT_SECONDS: self.text.seconds,
            K.RT_CONTEXT_CONTEXTS: float(f.contexts),
            K.RT_CONTEXT_BUDGET_FULL: float(f.budget_full),
            K.RT_CONTEXT_FUTURE_CELLS_DROPPED: float(f.future_cells_dropped),
            K.RT_CONTEXT_LABEL_CELLS_WITHHELD: float(f.label_cells_withheld),
            K.ENCODE_TEXT_CACHE_HITS: float(self.text.hits),
            K.ENCODE_TEXT_CACHE_MISSES: float(self.text.misses),
        }
        if cells.size:
            out |= {
                K.RT_CONTEXT_CELLS_MEAN: float(cells.mean()),
                K.RT_CONTEXT_CELLS_P50: float(np.median(cells)),
                K.RT_CONTEXT_CELLS_MAX: float(cells.max()),
            }
        return out

    def engine(self, clock: Clock) -> EngineBase | None:
        if self.driver is None:
            return None
        return LibraryEngine(self.spec, self.device, clock, _Steps(self.spec, self.driver, self, clock))


def _collate(enc: _Encoding, idx: np.ndarray) -> _Part:
    labels, present = enc.contexts.label_tensors(idx)
    return _Part(collate(enc.contexts, enc.vectors, idx), enc.rows[torch.from_numpy(idx)], labels, present)


class _Steps:
    """The ``Driver`` (tasks/libraries/engine.py) over an ``RTDriver``."""

    name = LIBRARY

    def __init__(self, spec: Spec, driver: RTDriver, side: RTSide, clock: Clock) -> None:
        self.spec, self.driver, self.side, self.clock = spec, driver, side, clock
        # collation seconds of the measured batches, by the phase whose step consumed them
        self.collate_seconds = {"train": 0.0, "predict": 0.0}
        self._pending = 0.0  # the batch collated last, not yet consumed by a step
        self.onnx: OnnxDriver | None = None
        self._onnx_dir: Path | None = None
        # one cell of the first predict batch (FLOPs count shapes, not values) and its padded
        # length: the FLOP model is fitted from it after the run, outside every timing
        self._example: tuple[dict[str, torch.Tensor], int] | None = None
        # what ONNX Runtime served, kept for facts() (asked after close()): the reference's
        # ONNX Runtime tags (tasks/backends/onnxruntime.py), one key per concept across libraries
        self._served: dict[str, str] = {}
        # the intra-op threads of the last ONNX Runtime session made, the one that served the
        # predict steps (after training, built by the calibration fit's first call at the
        # process's count): kept past close() for session_threads()
        self._session_threads: int | None = None

    def batches(self, chunk: LibraryChunk, rows: torch.Tensor) -> Iterator[tuple[Any, int]]:
        collated = cast(_Collated, chunk.inputs)
        if torch.equal(torch.sort(rows).values, collated.sorted_rows):
            # The rows tensorize planned for: its batches, in its plan's order (the length
            # buckets, and the training shuffle by seed and epoch), are the measured inputs,
            # each collated now (one batch held at a time) and its seconds counted.
            for idx in collated.plan:
                with self.clock.measure() as took:
                    part = _collate(collated.encoding, idx)
                self._pending = took.seconds
                yield part, int(part.rows.numel())
            return
        # Another set of rows (the calibration fit's half of the validation rows): collated
        # here, outside every stage, in the same plan over just those contexts.
        enc = collated.encoding
        where = torch.full((chunk.root_rows,), -1, dtype=torch.long)
        where[enc.rows] = torch.arange(enc.rows.numel())
        pos = where[rows]
        if bool((pos < 0).any()):
            raise RuntimeError("a batch asked for chunk rows the relational contexts do not hold")
        positions = pos.numpy()
        run = self.spec.run
        for idx in plan_batches(enc.contexts.lengths[positions], run.batch_size, run.bucketing, run.bucket_count):
            part = _collate(enc, positions[idx])
            yield part, int(part.rows.numel())

    def rows_of(self, part: Any) -> torch.Tensor:
        return cast(_Part, part).rows

    def _consumed(self, phase: str) -> None:
        self.collate_seconds[phase] += self._pending
        self._pending = 0.0

    def train_step(self, part: Any) -> None:
        self._consumed("train")
        p = cast(_Part, part)
        self.driver.train_step(p.batch, p.labels, p.present)
        self._drop_onnx()  # an export holds the weights of its time: a later predict re-exports

    def end_epoch(self) -> None:
        self.side.epoch += 1

    def predict_step(self, part: Any) -> torch.Tensor:
        self._consumed("predict")
        batch = cast(_Part, part).batch
        if self._example is None:
            self._example = (first_cell(batch), int(batch.is_padding.shape[1]))
        if self.spec.run.backend == "onnxruntime":
            scores = self._onnx(batch).scores(batch)
        else:
            scores = self.driver.scores(batch)
        if self.spec.task.kind == "regression":  # the harness's convention: the target's units
            stats = self.driver.stats
            return scores * stats.target_std + stats.target_mean
        return scores  # logits: binary [B], category [B, C] over the training classes

    def _onnx(self, example: RelationalBatch) -> OnnxDriver:
        if self.onnx is None:
            o = self.spec.run.onnxruntime
            if o.model is not None:
                path = Path(o.model).expanduser()
            else:
                self._onnx_dir = Path(tempfile.mkdtemp(prefix="relflow-rt-onnx-"))
                path = self.driver.export_onnx(self._onnx_dir / "model.onnx", example)
            self.onnx = self.driver.onnx(
                path,
                providers=tuple(o.providers),
                intra_op_threads=o.intra_op_threads,  # 0: torch.get_num_threads(), like for like
                inter_op_threads=o.inter_op_threads,
                graph_optimization_level=o.graph_optimization_level,
            )
            self._session_threads = self.onnx.intra_op_threads
            self._served = {
                "relflow.onnx_model_file": self.onnx.path.name,
                "relflow.providers": ",".join(self.onnx.providers),
                "relflow.onnxruntime.intra_op_threads": str(self.onnx.intra_op_threads),
                "relflow.library_onnx": "given" if o.model is not None else "exported by the library",
            }
        return self.onnx

    def _drop_onnx(self) -> None:
        if self.onnx is not None and self.spec.run.onnxruntime.model is None:
            self.onnx = None
            if self._onnx_dir is not None:
                shutil.rmtree(self._onnx_dir, ignore_errors=True)
                self._onnx_dir = None

    def layout_refs(self, part: Any) -> Any:
        return cast(_Part, part).batch.is_padding  # the batch's [contexts, cells] mask, not its vectors

    def layout(self, refs: Any) -> tuple[int, int, tuple[int, ...]]:
        is_padding = cast(torch.Tensor, refs)  # cells_present / cells_padded of its batch
        return int((~is_padding).sum()), int(is_padding.numel()), tuple(is_padding.shape)

    def cells(self, part: Any) -> torch.Tensor | None:
        return cast(_Part, part).batch.is_padding

    def predictions_table(self, keys: pa.Array, prediction: torch.Tensor) -> pa.Table:
        cols: dict[str, pa.Array] = {self.spec.schema_.root.key: keys}
        kind = self.spec.task.kind
        classes = pa.array(list(self.driver.stats.classes), pa.string())
        for name in self.spec.task.outputs:
            head, _, arg = name.partition(":")
            if head == "prediction" and kind == "category":
                cols["prediction"] = classes.take(pa.array(prediction.argmax(-1).numpy()))
            elif head == "prediction" and kind == "binary":
                cols["prediction"] = binary_probability(prediction)
            elif head == "prediction":
                cols["prediction"] = pa.array(prediction.numpy().astype(np.float64))
            elif head == "topk" and kind == "category":
                k = min(int(arg), prediction.shape[-1])
                scores, idx = torch.softmax(prediction, -1).topk(k, dim=-1)
                labels = classes.take(pa.array(idx.reshape(-1).numpy()))
                cols[f"top{k}_labels"] = pa.FixedSizeListArray.from_arrays(labels, k)
                cols[f"top{k}_scores"] = pa.FixedSizeListArray.from_arrays(pa.array(scores.reshape(-1).numpy()), k)
        return pa.table(cols)

    def facts(self) -> ModelFacts:
        run = self.spec.run
        flop_model, per_row, reason = None, None, "no predict batch ran"
        if self._example is not None:
            # the torch model's count: the ONNX graph is the same model
            cell, width = self._example
            flop_model = self.driver.flop_model(cell)
            per_row = flop_model.context(width) if flop_model is not None else None
            reason = "" if flop_model is not None else "FlopCounterMode's counts are not linear+quadratic in cells"
        tags = {
            "relflow.backend": run.backend,  # the reference's key (tasks/backends), not a library's own
            "relflow.library_bucketing": f"{run.bucketing} ({run.bucket_count} buckets)"
            if run.bucketing == "by_length"
            else "off",
            "relflow.library_links": "parent",
            # timing, not pretrained quality: the published models' MiniLM cannot be fetched here
            "relflow.library_cell_encoder": "hashing_encoder (384-wide, deterministic)",
            "relflow.library_category_head": "TaskHead over target_features, trained end to end"
            if self.spec.task.kind == "category"
            else "none (the published scalar decoder)",
        }
        tags |= self._served
        tags |= self.side.builder_tags()
        collate = {K.compute(phase, K.LIBRARY_COLLATE_SECONDS): s for phase, s in self.collate_seconds.items()}
        collate |= self.side.builder_metrics()
        # per root row of the first predict batch, at its padded shape
        return ModelFacts(LIBRARY, self.driver.parameters(), per_row, reason, tags, collate, flop_model)

    def save(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.driver.save(tmp)
        if path.is_dir():  # a folder cannot be replaced in one rename onto a non-empty one
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        tmp.replace(path)

    def session_threads(self) -> int | None:
        return self._session_threads if self.spec.run.backend == "onnxruntime" else None

    def paths(self) -> set[str]:
        if self.spec.run.backend == "onnxruntime":
            return {"rt-onnxruntime"}
        return {"rt-compiled" if self.spec.run.compile.model else "rt-eager"}

    def close(self) -> None:
        self.onnx = None
        if self._onnx_dir is not None:
            shutil.rmtree(self._onnx_dir, ignore_errors=True)
            self._onnx_dir = None
