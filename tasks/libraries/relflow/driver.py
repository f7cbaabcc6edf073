"""What the harness's compute engine calls per batch on a relflow model, and the facts it reports.

The harness owns batching, clocks and timing; nothing here reads a clock. A batch is a slice
of ``mapping.input_table``'s table: ``encode`` is the tensorize stage (relflow's
``Model.encode``), ``train_step``/``predict`` the compute stage, ``predictions_table`` the
write stage's input (relflow's ``Model.write``). Training also runs through a Lightning
Trainer the harness owns (``trainer``/``fit``): per-batch hooks of a harness Callback time
it, and ``MemoryLogger`` holds what relflow's own callbacks log until the harness copies it.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, cast

import lightning.pytorch as lit
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import relflow as rf
import torch
from lightning.pytorch.loggers import Logger
from relflow.architecture.compiler import Region
from relflow.architecture.encoder import BranchEncoder
from relflow.architecture.packed import customized, stochastic
from relflow.architecture.pool import LearnedQueryCrossAttention
from relflow.logging.throughput import ThroughputLogger
from relflow.structs.enums import Strata, TensorKey
from relflow.tensorfields.shared.counter import CounterUpdateCallback
from relflow.tensorfields.shared.vocabulary import AdmittedRowsCallback
from tensordict import TensorDict
from torch._dynamo import eval_frame
from torch.utils.flop_counter import FlopCounterMode

from model.batch import UNSEEN_CLASS
from tasks.libraries.relflow.mapping import branch_path, build, field_name, input_table, target_address
from tasks.spec import Spec

__all__ = [
    "CompiledCalls",
    "FieldOccupancy",
    "MemoryLogger",
    "Occupancy",
    "OccupancyMasks",
    "PackingFact",
    "RelflowDriver",
    "ThroughputRows",
    "throughput_rows",
]

# What relflow's callbacks log, as Lightning hands it to a logger (relflow's Metric names).
THROUGHPUT_TRAIN, THROUGHPUT_PREDICT, LOSS_TRAIN = "throughput/train", "throughput/predict", "loss/train"
# Model.training_step logs through LightningModule.log, which warns once per call when no
# Trainer is attached (the harness's own loop): the loss is returned either way.
_NO_TRAINER_LOG = r"You are trying to `self.log\(\)` but the `self.trainer` reference"
_PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}


# --- facts ---------------------------------------------------------------------------------


class FieldOccupancy(NamedTuple):
    """Coordinates of one field (or slots of one branch) in a batch.

    ``present``: live coordinates (valued, null or learned-mask: model inputs);
    ``allocated``: the tensor relflow built, whose branch axes are the batch's longest
    retained list, not the configured length; ``reserved``: rows x configured lengths."""

    present: int
    allocated: int
    reserved: int


@dataclass(frozen=True)
class Occupancy:
    rows: int
    fields: dict[str, FieldOccupancy]  # input leaves by relflow address; the target is no input
    sequences: dict[str, FieldOccupancy]  # branch slots (records) by relflow address

    @property
    def present(self) -> int:
        return sum(f.present for f in self.fields.values())

    @property
    def reserved(self) -> int:
        return sum(f.reserved for f in self.fields.values())

    @property
    def allocated(self) -> int:
        return sum(f.allocated for f in self.fields.values())


@dataclass(frozen=True)
class OccupancyMasks:
    """An encoded batch's present masks (per input field) and slot masks (per branch), each
    with its reserved count, by reference: ``count`` makes the ``Occupancy``."""

    rows: int
    fields: dict[str, tuple[torch.Tensor, int]]  # address -> (present mask, reserved)
    sequences: dict[str, tuple[torch.Tensor, int]]  # address -> (slot mask, reserved)

    def count(self) -> Occupancy:
        def one(mask: torch.Tensor, reserved: int) -> FieldOccupancy:
            return FieldOccupancy(int(mask.sum()), mask.numel(), reserved)

        return Occupancy(
            rows=self.rows,
            fields={a: one(*f) for a, f in self.fields.items()},
            sequences={a: one(*f) for a, f in self.sequences.items()},
        )


@dataclass(frozen=True)
class PackingFact:
    """Whether one encoder region packs present coordinates, and why not."""

    region: str  # "<branch address> sequence" or "<branch address> coordinates"
    eligible: bool
    why_not: str | None


@dataclass
class CompiledCalls:
    """Region calls after ``compile``: how many ran the compiled graph, how many fell back to
    eager, and why (``packing``: a packed call, which relflow keeps eager; ``customized``:
    hooks or replaced modules in the region; ``force_eager``: the compiled path under
    ``torch.compiler.set_stance("force_eager")``, as the calibration fit runs)."""

    compiled: int = 0
    eager: Counter[str] = field(default_factory=Counter)
    regions: int = 0

    @property
    def eager_total(self) -> int:
        return sum(self.eager.values())


@dataclass(frozen=True)
class ThroughputRows:
    """Rows behind a throughput figure over ``batches`` batches.

    ``estimated_rows``: completed batches x configured batch size, the rule the relflow
    performance note documents for its throughput callback; ``logger_rows``: what relflow
    0.4.0's ``ThroughputLogger`` actually divides by (each batch's own row count,
    relflow/logging/throughput.py); ``exact_rows``: the rows the harness sent."""

    batches: int
    batch_size: int
    exact_rows: int
    estimated_rows: int
    logger_rows: int


def throughput_rows(batch_rows: Sequence[int], batch_size: int) -> ThroughputRows:
    exact = int(sum(batch_rows))
    return ThroughputRows(
        batches=len(batch_rows),
        batch_size=batch_size,
        exact_rows=exact,
        estimated_rows=len(batch_rows) * batch_size,
        logger_rows=exact,
    )


class MemoryLogger(Logger):
    """A Lightning logger that keeps every logged metric in memory, so relflow's own figures
    (``throughput/*``, ``loss/*``, ``.<target>/<split>.*``) reach MLflow after the timed
    region instead of from inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[int | None, str, float]] = []
        self.latest: dict[str, float] = {}  # each key's last value (what callback_metrics keeps)

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> str:
        return "0"

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        for key, value in metrics.items():
            self.records.append((step, key, float(value)))
            self.latest[key] = float(value)

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        return None

    def series(self, key: str) -> list[float]:
        return [value for _, k, value in self.records if k == key]


class _CountedRegion(Region[Any]):
    """relflow's compiled region, counting which path each call took (set on live regions by
    ``RelflowDriver.compile``; relflow's own ``clear`` and ``compile`` still recognise it)."""

    calls: CompiledCalls

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        before = self.calls.compiled + self.calls.eager["force_eager"]
        out = super().__call__(*args, **kwargs)
        if self.calls.compiled + self.calls.eager["force_eager"] == before:  # relflow chose eager itself
            self.calls.eager["packing" if kwargs.get("packing") is not None else "customized"] += 1
        return out


@dataclass(frozen=True)
class _LoopState:
    """What relflow's training callbacks read from a Trainer, for the harness's own loop."""

    current_epoch: int


@dataclass(frozen=True)
class _LoggerHost:
    """What relflow's ``ThroughputLogger`` reads from a Trainer to publish a predict figure
    (it sends those straight to ``trainer.loggers``), for the harness's own loop."""

    loggers: tuple[Logger, ...]
    is_global_zero: bool = True


class _Epochs:
    """Re-iterable for Lightning: each ``iter`` (one per epoch) asks the harness for that
    epoch's batches, so encoding (``strata=train``, per-epoch draws) happens in the harness's
    own iteration, timed as its tensorize stage."""

    def __init__(self, batches: Callable[[int], Iterable[TensorDict]]) -> None:
        self.batches, self.epoch = batches, 0

    def __iter__(self) -> Iterator[TensorDict]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        return iter(self.batches(epoch))


# --- the driver ----------------------------------------------------------------------------


class RelflowDriver:
    """One relflow model under the harness: construct from the spec and the model
    (``RelflowDriver.build`` makes the model from a table), then call per batch."""

    def __init__(self, spec: Spec, model: rf.Model, device: torch.device | str = "cpu") -> None:
        self.spec, self.model = spec, model
        self.device = torch.device(device)
        self.model.to(self.device)
        self.key = spec.schema_.root.key
        self.target = target_address(spec)
        self.calls = CompiledCalls()
        self._optimizer: torch.optim.Optimizer | None = None
        self._scaler: torch.amp.GradScaler | None = None
        # The own loop's place in training, as a Trainer would report it to relflow's callbacks.
        self.epoch = 0
        self._batch = 0
        self._admitted = AdmittedRowsCallback()
        self._counters = CounterUpdateCallback()
        # relflow's own throughput callback, run by the own loop at a Trainer's batch hooks;
        # what it logs (and each training loss) lands in ``logger``, read after the timed region.
        self.logger = MemoryLogger()
        self._throughput = ThroughputLogger()
        self._host = _LoggerHost((self.logger,))
        self._predict_batch = 0
        self._steps_done = 0  # training steps over every epoch (a Trainer's global step)

    @classmethod
    def build(cls, spec: Spec, table: pa.Table, device: torch.device | str = "cpu") -> RelflowDriver:
        return cls(spec, build(spec, table), device)

    # --- tensorize -------------------------------------------------------------------------

    def input_table(self, table: pa.Table) -> pa.Table:
        """The harness's nested table as relflow reads it (``mapping.input_table``)."""
        return input_table(self.spec, table)

    def encode(self, table: pa.Table, *, train: bool, epoch: int = 0) -> TensorDict:
        """relflow's ``Model.encode`` of one batch of ``input_table`` rows.

        ``train=True`` uses ``strata=train``: relflow then learns from the batch as it encodes
        (vocabularies grow, numeric statistics update, new embedding rows are committed, with
        the optimizer's state) and draws its training masks from ``(run.seed, epoch)``, so a
        training batch is encoded right before its step, once per epoch. ``train=False`` uses
        ``strata=predict``: no learning, no random masks."""
        strata = Strata.train if train else Strata.predict
        td = self.model.encode(table, strata=strata, seed=self.spec.run.seed, epoch=epoch)
        return td.to(self.device) if self.device.type != "cpu" else td

    @staticmethod
    def take(td: TensorDict, rows: torch.Tensor | slice) -> TensorDict:
        """Root rows of an encoded batch (branch axes keep the whole batch's extent)."""
        return td[rows]

    # --- train -----------------------------------------------------------------------------

    def optimizer(self) -> torch.optim.Optimizer:
        """``rf.adamw`` from ``run.learning_rate``/``run.adamw``, bound to the model's current
        parameters and set as ``model.optimizer``: relflow grows embedding rows while encoding
        training batches and carries the optimizer's state across only for optimizers it finds
        there (relflow/architecture/binding.py)."""
        if self._optimizer is None:
            run = self.spec.run
            factory = rf.adamw(run.learning_rate, weight_decay=run.adamw.weight_decay, fused=run.adamw.fused)
            self._optimizer = factory(self.model)
            self.model.optimizer = self._optimizer
        return self._optimizer

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        precision = self.spec.run.precision
        if precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def train_step(self, td: TensorDict) -> float:
        """One optimizer step of the harness's own loop on a batch encoded with ``train=True``.

        relflow puts part of its training in Lightning callbacks; the one that changes the
        numbers runs here as a Trainer would run it: ``AdmittedRowsCallback`` gives category
        labels admitted while encoding a random start before their first step (they are
        admitted at zero, and zero rows are indistinguishable to attention). Call
        ``end_epoch`` after each epoch."""
        optimizer = self.optimizer()
        if self.spec.run.precision == "fp16" and self._scaler is None:
            self._scaler = torch.amp.GradScaler(self.device.type)
        self.model.train()
        host = cast(Any, self._host)
        self._admitted.on_train_batch_start(cast(Any, _LoopState(self.epoch)), self.model, td, self._batch)
        self._throughput.on_train_batch_start(host, self.model, td, self._batch)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_NO_TRAINER_LOG)
            with self._autocast():
                out = self.model.training_step(td, self._batch)
            if out is None:  # no target in this batch: relflow skips it
                loss_value = float("nan")
            else:
                loss = out["loss"]
                optimizer.zero_grad(set_to_none=True)
                if self._scaler is not None:
                    self._scaler.scale(loss).backward()
                    self._scaler.step(optimizer)
                    self._scaler.update()
                else:
                    loss.backward()
                    optimizer.step()
                loss_value = float(loss.detach())
            # A Trainer's on_train_batch_end comes after the optimizer step; relflow's callback
            # logs its figure through LightningModule.log, which needs a Trainer: copied here
            # (at every step, as log_every_n_steps=1 would).
            self._throughput.on_train_batch_end(host, self.model, out, td, self._batch)
        step = self._steps_done
        self.logger.log_metrics({THROUGHPUT_TRAIN: self._throughput.throughput[Strata.train]}, step=step)
        if out is not None:
            self.logger.log_metrics({LOSS_TRAIN: loss_value}, step=step)
        self._batch += 1
        self._steps_done += 1
        return loss_value

    def end_epoch(self) -> None:
        """Close one epoch of the own loop as a Trainer would: relflow's
        ``CounterUpdateCallback`` folds the epoch's label counts (a no-op in one process
        beyond clearing them), and the next epoch's batches count from 0 again."""
        self._counters.on_train_epoch_end(cast(Any, _LoopState(self.epoch)), self.model)
        self.epoch += 1
        self._batch = 0

    def trainer(
        self,
        *,
        callbacks: Sequence[lit.Callback] = (),
        logger: Logger | None = None,
        log_every_n_steps: int = 50,
    ) -> lit.Trainer:
        """A Lightning Trainer the harness owns: epochs from ``run.epochs``, precision from
        ``run.precision``, the spec's device, no validation loop, no checkpointing, early
        stopping or rollback (what ``Model.fit`` adds by default), no progress bar.
        relflow's callbacks (throughput, vocabulary, counters) attach themselves through
        ``Model.configure_callbacks``; torch's thread settings are left to the harness."""
        cuda = self.device.type == "cuda"
        accelerator = "cuda" if cuda else "cpu"
        devices: list[int] | int = [self.device.index or 0] if cuda else 1
        return lit.Trainer(
            accelerator=accelerator,
            devices=devices,
            max_epochs=self.spec.run.epochs,
            precision=_PRECISION[self.spec.run.precision],  # type: ignore[arg-type]
            callbacks=list(callbacks),
            logger=logger if logger is not None else False,
            log_every_n_steps=log_every_n_steps,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
        )

    def fit(
        self,
        batches: Callable[[int], Iterable[TensorDict]],
        *,
        callbacks: Sequence[lit.Callback] = (),
        logger: Logger | None = None,
        log_every_n_steps: int = 50,
    ) -> lit.Trainer:
        """Train through ``trainer()``; ``batches(epoch)`` yields that epoch's training
        batches, each encoded with ``encode(..., train=True, epoch=epoch)`` while the Trainer
        runs (so new vocabulary rows reach the Trainer's optimizer)."""
        self.optimizer()
        runner = self.trainer(callbacks=callbacks, logger=logger, log_every_n_steps=log_every_n_steps)
        try:
            runner.fit(self.model, train_dataloaders=_Epochs(batches))
        finally:
            # A model left attached to a finished Trainer logs into its closed loop:
            # LightningModule.log then raises in the next own-loop train_step.
            self.model.trainer = None
            self.model.to(self.device)
        return runner

    # --- predict ---------------------------------------------------------------------------

    def forward(self, td: TensorDict) -> list[Any]:
        """relflow's forward in predict mode: its ``Prediction`` list for ``predictions_table``."""
        self.model.eval()
        with torch.inference_mode(), self._autocast():
            return cast(list[Any], self.model(td, strata=Strata.predict))

    def predict(self, td: TensorDict) -> dict[str, torch.Tensor]:
        """``forward`` reduced to tensors (see ``outputs``), between relflow's throughput
        callback's predict hooks, as ``Trainer.predict`` runs its ``predict_step``: the callback
        logs this batch's rows per second to ``logger`` (``throughput/predict``, step = the
        batch's index)."""
        host = cast(Any, self._host)
        self._throughput.on_predict_batch_start(host, self.model, td, self._predict_batch)
        out = self.outputs(self.forward(td), td)
        self._throughput.on_predict_batch_end(host, self.model, out, td, self._predict_batch)
        self._predict_batch += 1
        return out

    def logged(self, training: bool) -> float:
        """relflow's own throughput figure for the latest batch of a phase (rows per second,
        from its ``ThroughputLogger``: that batch's own rows over its batch-hook seconds)."""
        return self.logger.latest[THROUGHPUT_TRAIN if training else THROUGHPUT_PREDICT]

    def classes(self) -> list[str]:
        """A category target's class labels, in the order of ``outputs``' class axis (relflow's
        vocabulary, learned while encoding training batches)."""
        return [str(v) for v in rf.Category.vocabulary(self.model, self.target)]

    def outputs(self, predictions: list[Any], td: TensorDict) -> dict[str, torch.Tensor]:
        """Per target coordinate (root rows, or flattened present branch rows for a branch
        target): ``logits`` ([N, C] category over ``classes()``, [N] binary), ``prediction``
        (class probabilities [N, C], probability of true [N], or the value in the target's
        units [N]), and ``root_embedding`` / ``branch_embedding:<b>`` [N, d]
        when asked for."""
        by_address = {str(p.address): p for p in predictions}
        # The target is skipped as an input (its ``present`` is all false): its coordinates
        # are the records of the branch holding it, the root's one per row.
        holder = "/" + "/".join(branch_path(self.spec, self.spec.task.branch))
        present = cast(torch.Tensor, td["/"][holder].slots).reshape(-1).bool()
        payload = by_address[self.target].payload
        content = cast(torch.Tensor, payload[TensorKey.content])
        kind = self.spec.task.kind
        out: dict[str, torch.Tensor] = {}
        if kind == "category":
            size = len(rf.Category.vocabulary(self.model, self.target))
            logits = content.reshape(-1, content.shape[-1])[present][:, :size].float()
            out["logits"], out["prediction"] = logits, logits.softmax(-1)
        elif kind == "binary":
            logits = content.reshape(-1)[present].float()
            out["logits"], out["prediction"] = logits, logits.sigmoid()
        else:
            out["prediction"] = content.reshape(-1)[present]
        for name in self.spec.task.outputs:
            head, _, arg = name.partition(":")
            if head == "root_embedding":
                out[name] = cast(torch.Tensor, by_address["/"].payload[TensorKey.embedding])
            elif head == "branch_embedding":
                address = "/" + "/".join(branch_path(self.spec, arg))
                out[name] = cast(torch.Tensor, by_address[address].payload[TensorKey.embedding])
        return out

    def labels(self, table: pa.Table) -> tuple[torch.Tensor, torch.Tensor]:
        """The target column of ``input_table`` rows as quality labels, aligned with
        ``outputs``: (class index into ``classes()`` / 1.0-0.0 / value, present). relflow's
        predict encoding never reads the target (its coordinates are padding there), so the
        labels come from the Arrow column, columnar. A category value outside the vocabulary
        learned so far is ``UNSEEN_CLASS``, not present (scored as wrong, model/batch.py)."""
        column: pa.Array | pa.ChunkedArray = table[field_name(self.spec.task.branch or self.spec.task.target)]
        if self.spec.task.branch:
            for name in branch_path(self.spec, self.spec.task.branch)[1:]:
                column = pc.struct_field(pc.list_flatten(column), name)
            column = pc.struct_field(pc.list_flatten(column), field_name(self.spec.task.target))
        values = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        if pa.types.is_dictionary(values.type):
            values = cast(pa.DictionaryArray, values).dictionary_decode()
        if self.spec.task.kind == "category":
            vocabulary = pa.array(list(rf.Category.vocabulary(self.model, self.target)))
            known = values.is_valid().to_numpy(zero_copy_only=False)
            if len(vocabulary) == 0:  # nothing learned yet (untrained weights): every class unseen
                unseen = np.where(known, UNSEEN_CLASS, 0).astype(np.int64)
                return torch.from_numpy(unseen), torch.zeros(len(values), dtype=torch.bool)
            if values.type != vocabulary.type:
                values = pc.cast(values, vocabulary.type)
            index = pc.index_in(values, value_set=vocabulary)
            ok = index.is_valid().to_numpy(zero_copy_only=False)
            filled = pc.fill_null(index, 0).to_numpy(zero_copy_only=False).astype(np.int64)
            filled[~ok & known] = UNSEEN_CLASS
            return torch.from_numpy(filled), torch.from_numpy(ok.copy())
        number = pc.cast(values, pa.float64(), safe=not pa.types.is_integer(values.type))  # ints past 2**53 round
        present = torch.from_numpy(number.is_valid().to_numpy(zero_copy_only=False).copy())
        return torch.from_numpy(pc.fill_null(number, 0.0).to_numpy(zero_copy_only=False).copy()), present

    def predictions_table(self, table: pa.Table, predictions: list[Any]) -> pa.Table:
        """relflow's own prediction table (``Model.write``: ``predictions`` nested under field
        names, ``representations`` when embeddings are asked for) with the root key as the
        first column; ``table`` is the batch's ``input_table`` rows."""
        written = self.model.write(predictions, source=table, retain=(self.key,))
        key = written.column("inputs").combine_chunks().field(self.key)
        return written.drop(["inputs"]).add_column(0, self.key, key)

    # --- facts -----------------------------------------------------------------------------

    def parameter_count(self) -> int:
        """Parameters now: relflow's category embeddings grow with the vocabulary while
        training, so count after fitting."""
        return sum(p.numel() for p in self.model.parameters())

    def occupancy(self, td: TensorDict) -> Occupancy:
        """Present vs allocated vs reserved coordinates of an encoded batch, per input field
        and per branch."""
        return self.occupancy_masks(td).count()

    def occupancy_masks(self, td: TensorDict) -> OccupancyMasks:
        """The masks ``occupancy`` counts, by reference (no reduction, no host copy): a timed
        loop keeps them and counts them after its timing (``OccupancyMasks.count``)."""
        schema = self.model.schema
        rows = int(td.batch_size[0])
        fields: dict[str, tuple[torch.Tensor, int]] = {}
        for address, request in schema.active_requests.items():
            if not request.embedded:
                continue
            present = cast(torch.Tensor, td[address].present)
            fields[str(address)] = (present, rows * math.prod(n or 1 for n in request.shape))
        geometry = td["/"]
        sequences: dict[str, tuple[torch.Tensor, int]] = {}
        for address, branch in schema.branches.items():
            if str(address) == "/" or address not in geometry.keys():  # noqa: SIM118 - TensorDict refuses `in`
                continue
            slots = cast(torch.Tensor, geometry[address].slots)
            lengths = [getattr(n, "length", None) or 1 for n in branch.path if getattr(n, "type", None) == "branch"]
            sequences[str(address)] = (slots, rows * math.prod(lengths))
        return OccupancyMasks(rows, fields, sequences)

    def packing(self, training: bool) -> list[PackingFact]:
        """relflow's own eligibility test (relflow/architecture/packed.py) per encoder region,
        in training or predict mode: no layers, hooks or replaced modules, or active dropout
        keep a region on the padded path. An eligible region packs each call whose
        coordinates are not all present."""
        was = self.model.training
        self.model.train(training)
        facts: list[PackingFact] = []
        try:
            for module in self.model.modules():
                if not isinstance(module, BranchEncoder):
                    continue
                regions: list[tuple[str, list[torch.nn.Module]]] = [("sequence", list(module.encoder))]
                if module.coordinate_encoder is not None:
                    regions.append(("coordinates", [module.coordinate_encoder]))
                for name, layers in regions:
                    why = (
                        "no encoder layers"
                        if not layers
                        else "hooks or replaced modules"
                        if customized(layers)
                        else "dropout active while training"
                        if stochastic(cast(Any, layers))
                        else None
                    )
                    facts.append(PackingFact(f"{module.origin} {name}", why is None, why))
        finally:
            self.model.train(was)
        return facts

    def compile(self) -> CompiledCalls:
        """relflow's ``Model.compile`` with ``run.compile``'s regions and settings; returns the
        counter of compiled vs eager region calls from now on. A call with both switches off
        restores eager execution (relflow's own semantics)."""
        c = self.spec.run.compile
        self.model.compile(
            encoders=c.encoders,
            pools=c.pools,
            backend=c.backend,
            dynamic=c.dynamic,
            options=dict(c.options) or None,
        )
        self.calls = CompiledCalls()
        for module in self.model.modules():
            region = module.__dict__.get("compute")
            if isinstance(region, Region) and isinstance(module, (BranchEncoder, LearnedQueryCrossAttention)):
                region.__class__ = _CountedRegion
                counted = cast(_CountedRegion, region)
                counted.calls = self.calls
                counted.compiled = self._counting(counted.compiled)
                self.calls.regions += 1
        return self.calls

    def _counting(self, compiled: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        calls = self.calls

        def run(*args: Any, **kwargs: Any) -> torch.Tensor:
            # under set_stance("force_eager") (the calibration fit) the compiled callable runs
            # eager: counted as such, or the compiled count held calls no graph ran
            if eval_frame._stance.stance == "force_eager":
                calls.eager["force_eager"] += 1
            else:
                calls.compiled += 1
            return compiled(*args, **kwargs)

        return run

    def flops(self, td: TensorDict) -> tuple[int | None, str | None]:
        """FLOPs of one predict forward (torch's FlopCounterMode: matmuls and attention at the
        shapes that ran, so packing's saving shows), or None and the reason."""
        self.model.eval()
        counter = FlopCounterMode(display=False)
        try:
            with torch.inference_mode(), counter:
                self.model(td, strata=Strata.predict)
        except Exception as e:  # noqa: BLE001 - any failure is the reported reason
            return None, f"FlopCounterMode over relflow's forward failed: {type(e).__name__}: {e}"
        return int(counter.get_total_flops()), None

    # --- checkpoints -----------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """relflow's own checkpoint (``Model.save``: weights, schema and every learned
        vocabulary, which lives in the state dict); compilation is not kept."""
        return Path(self.model.save(Path(path)))

    @classmethod
    def load(cls, spec: Spec, path: str | Path, device: torch.device | str = "cpu") -> RelflowDriver:
        return cls(spec, rf.Model.load(Path(path)), device)
