"""The reference model's engine (``model/``): train on the training split, then predict every
root row. ``ReferenceSide.engine`` (side.py) builds it; the chain runs its steps as the compute stage.

``Engine`` holds the model, optimizer and per-phase timings for the whole run, so the
first call (lazy compilation included) and warm-up batches are counted once per phase, not
once per chunk. Each batch is timed in two parts through the clock's window (the
synchronising clock on CPU; CUDA events read once per window on CUDA, tasks/measure/clock.py): getting the
input ready (slicing the chunk, host->device copy) and the model step. The first part is
time the device waits for input (``device.input_wait_fraction``).
"""

from __future__ import annotations

import functools
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from model import ModelConfig, RelationalTransformer, bucketing
from model.arrow import Encoding, encode_trimmed, flatten, mask_coordinate_counts, present_masks
from model.batch import Batch
from model.data import ArrowDataModule
from model.meta import inspect_on_meta
from model.precision import autocast_context
from model.quantize import Fp8Linear
from model.schema import ModelSchema
from tasks.backends import Backend
from tasks.backends.checkpoint import optimizer_settings, save_run_checkpoint
from tasks.backends.pytorch import PyTorchBackend, whole_model
from tasks.measure.clock import Clock
from tasks.measure.present_flops import flops_of_shapes
from tasks.measure.quality import Quality
from tasks.spec import Spec
from tasks.stages.engine import EngineBase, Layout, ModelFacts, PredictOutputs
from tasks.stages.tensorize import Chunk, Tensorized, layout
from tasks.stages.write import to_table

__all__ = ["Engine"]


def _count_shapes(shapes: Counter[tuple[int, ...]], size: int, present: list[torch.Tensor]) -> None:
    """Add a batch's ``size`` root rows to ``shapes`` by present shape: each non-root node's
    longest present instance under the root (``present``: the nodes' masks, walk order)."""
    if not present:
        shapes[()] += size
        return
    lengths = torch.stack([p.sum(-1).reshape(size, -1).amax(1) for p in present], dim=1).cpu()
    unique, counts = torch.unique(lengths, dim=0, return_counts=True)
    for shape, n in zip(unique.tolist(), counts.tolist(), strict=True):
        shapes[tuple(shape)] += n


class Engine(EngineBase):
    """The reference model's engine (``model/``): its batches, train and predict steps."""

    def __init__(
        self,
        spec: Spec,
        schema: ModelSchema,
        device: torch.device,
        state_dict: dict[str, Any] | None = None,
        clock: Clock | None = None,
        encoding: Encoding | None = None,
        optimizer_state: dict[str, Any] | None = None,
        backend: Backend | None = None,
    ) -> None:
        self.schema, self.encoding = schema, encoding  # loader workers encode with the encoding
        super().__init__(spec, device, clock)
        torch.manual_seed(spec.run.seed)
        cfg = ModelConfig(
            d_model=spec.model.d_model, layers=spec.model.layers, heads=spec.model.heads, dropout=spec.model.dropout
        )
        self.model = RelationalTransformer(schema, cfg).to(device)
        if state_dict is not None:
            self.model.load_state_dict(state_dict)
        self.model.packing = spec.run.packing
        c = spec.run.compile
        if c.encoders or c.pools:
            self.model.compile(
                encoders=c.encoders,
                pools=c.pools,
                backend=c.backend,
                dynamic=c.dynamic,
                options=dict(c.options) or None,
                mode=c.mode,
            )
        # The predict step runs through a backend (tasks/backends): the one given, else PyTorch
        # over this model. run.compile.model compiles the whole model.
        self.forward: Callable[..., dict[str, torch.Tensor]] = (
            whole_model(self.model, c.backend, dict(c.options) or None, c.mode) if c.model else self.model
        )
        self.backend: Backend = backend or PyTorchBackend(self.model, self.forward, self.autocast)
        # The model package's AdamW factory: fused by default (torch 2.13 has a CPU fused kernel).
        self.model.optimizer = optimizer_settings(spec)
        # Resuming (train+predict with run.checkpoint): the saved optimizer state, whose
        # settings tasks/backends/checkpoint.py already checked against the spec.
        self._optimizer_state = optimizer_state
        # fp16 gradients underflow without loss scaling; bf16 and fp32 need none.
        self.scaler = torch.amp.GradScaler("cuda") if spec.run.precision == "fp16" and device.type == "cuda" else None
        self.model.batch_size = spec.run.batch_size
        self.optimizer_settings = self.model.optimizer
        self.optimizer: torch.optim.Optimizer | None = None
        self._data_module: ArrowDataModule | None = None
        self._generator = torch.Generator().manual_seed(spec.run.seed)
        # Length bucketing: root rows of each batch in the order they ran (outputs are put
        # back in key order).
        self._ran_rows: list[torch.Tensor] = []
        # Steady batches' root rows by present shape, per phase (tasks/measure/present_flops.py).
        self._steady_shapes: dict[str, Counter[tuple[int, ...]]] = {"train": Counter(), "predict": Counter()}
        # Each steady batch's present masks, by reference, until ``steady_shapes`` is read
        # (after the timed region): counting them (a sum, stack and unique per batch, and a
        # host sync) inside the batch loop landed in compute seconds, e2e and every request's
        # latency. They cost one byte per slot of the batch's own (bucket-cut) shape meanwhile.
        self._pending_shapes: dict[str, list[tuple[int, list[torch.Tensor]]]] = {"train": [], "predict": []}
        self._meta: dict[tuple[str, ...], dict[str, int]] = {}  # ``_on_meta``: a meta pass per outputs

    def new_quality(self) -> Quality:
        """Quality in the target's own units: regression errors are scaled back."""
        enc = self.encoding
        return Quality(
            self.spec.task.kind, target_mean=enc.target_mean if enc else 0.0, target_std=enc.target_std if enc else 1.0
        )

    def train_through(self, forward: Callable[..., dict[str, torch.Tensor]]) -> None:
        """Training steps call ``forward``: a DDP wrapper of this model, whose backward
        all-reduces the gradients (the optimizer and loss stay the model's own)."""
        self.forward = forward

    def serve_with(self, backend: Backend) -> None:
        """The backend predict passes run through from now on (chosen after training: ONNX
        Runtime serves the weights this run trained, so it can only start then)."""
        self.backend = backend

    def backend_tags(self) -> dict[str, Any]:
        return self.backend.tags()

    def session_threads(self) -> int | None:
        return self.backend.session_threads()

    @contextmanager
    def untracked(self) -> Iterator[None]:
        """As the base's, and the fp8 fallback counts are put back too."""
        fallbacks = [
            (m.fallback_calls, m.fallback_calls.clone()) for m in self.model.modules() if isinstance(m, Fp8Linear)
        ]
        try:
            with super().untracked():
                yield
        finally:
            for live, before in fallbacks:
                live.copy_(before)

    def steady_batch(self, phase: str, part: Batch) -> None:
        """Inside the timed loop: keep references only (counted in ``steady_shapes``)."""
        self._pending_shapes[phase].append(
            (part.size, [part.nodes[n.name].present for n in self.schema.root.walk()[1:]])
        )

    @property
    def steady_shapes(self) -> dict[str, Counter[tuple[int, ...]]]:
        """Steady root rows by present shape, per phase (``compute.mfu`` counts their FLOPs);
        read after the timed region, which is when the kept batches are counted."""
        for phase, pending in self._pending_shapes.items():
            for size, present in pending:
                _count_shapes(self._steady_shapes[phase], size, present)
            pending.clear()
        return self._steady_shapes

    def close(self) -> None:
        if self._data_module is not None:
            self._data_module.close()
            self._data_module = None

    def autocast(self) -> AbstractContextManager[Any]:
        if self.spec.run.precision == "fp32":
            return nullcontext()
        return autocast_context(self.device, self.spec.run.precision)

    def _input(self, batch: Batch, index: torch.Tensor) -> Batch:
        part = batch.select(index)
        if self.spec.run.loader.pin_memory and self.device.type == "cuda":
            part = part.pin_memory()
        return part.to(self.device, non_blocking=self.device.type == "cuda")

    def _bucketed(self, tz: Tensorized, rows: torch.Tensor, shuffle: bool) -> Iterator[tuple[Batch, int]]:
        """``run.bucketing: by_length``: batches of roots with similar context sizes, each cut
        to its own longest instance per branch (compiled regions: its bucket's)."""
        run = self.spec.run
        if tz.shapes is None:  # tensorized without bucketing: measure the sizes here
            if tz.batch is not None:
                tz.shapes = bucketing.root_shapes(tz.batch, self.schema)
            else:
                assert tz.table is not None  # loader mode: the Arrow rows
                tz.shapes = bucketing.arrow_root_shapes(
                    flatten(tz.table, layout(self.spec)), self.schema, tz.table.num_rows
                )
        pad_to: bucketing.PadTo = "bucket" if (run.compile.encoders or run.compile.pools) else "batch"
        planned = bucketing.plan(
            tz.shapes, rows, run.batch_size, run.bucket_count, self._generator if shuffle else None, pad_to
        )
        if tz.batch is not None:
            for p in planned:
                self._ran_rows.append(p.rows)
                part = bucketing.take(tz.batch, self.schema, p.rows, p.lengths)
                if self.spec.run.loader.pin_memory and self.device.type == "cuda":
                    part = part.pin_memory()
                yield part.to(self.device, non_blocking=self.device.type == "cuda"), int(p.rows.numel())
            return
        assert tz.table is not None and self.encoding is not None
        # Loader workers cut fixed-size ranges from the planned order: every batch but the
        # last is full, so the ranges are exactly the planned batches.
        order = torch.cat([p.rows for p in planned])
        self._ran_rows.append(order)
        table = tz.table.take(pa.array(order.numpy()))
        ld = self.spec.run.loader
        trimmed = functools.partial(encode_trimmed, schema=self.schema, layout=layout(self.spec), enc=self.encoding)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pin_memory off CUDA is a no-op, said in the README
            dm = ArrowDataModule(
                self.model,
                validate=table,
                batch_size=run.batch_size,
                num_workers=ld.num_workers,
                persistent_workers=ld.persistent_workers,
                pin_memory=ld.pin_memory,
                prefetch_factor=ld.prefetch_factor,
                encode=trimmed,
            )
        for part in dm.val_dataloader():
            yield part, part.size

    def batches(self, tz: Tensorized, rows: torch.Tensor, shuffle: bool = False) -> Iterator[tuple[Batch, int]]:
        """Device batches over root ``rows`` in order: sliced from the chunk's tensors, or
        encoded by ``ArrowDataModule`` workers when ``run.loader.num_workers > 0``."""
        bs = self.spec.run.batch_size
        if self.spec.run.bucketing == "by_length":
            yield from self._bucketed(tz, rows, shuffle)
            return
        if tz.batch is not None:
            for idx in rows.split(bs):
                yield self._input(tz.batch, idx), int(idx.numel())
            return
        assert tz.table is not None and self.encoding is not None
        table = tz.table
        parts = (table.take(pa.array(idx.numpy())) for idx in rows.split(bs))
        loader = self.data_module().stream(parts, count=(rows.numel() + bs - 1) // bs)
        # Starting (or, when persistent, re-arming) the workers is not input wait.
        with self.clock.measure() as start:
            it = iter(loader)
        self.worker_startup_seconds += start.seconds
        non_blocking = bool(loader.pin_memory) and self.device.type == "cuda"
        for part in it:
            yield part.to(self.device, non_blocking=non_blocking), part.size

    def data_module(self) -> ArrowDataModule:
        """One data module per run, so ``persistent_workers`` keeps its workers across chunks,
        epochs and passes (the loader is fed Arrow slices; workers only encode)."""
        if self._data_module is None:
            ld = self.spec.run.loader
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # pin_memory off CUDA is a no-op, said in the README
                self._data_module = ArrowDataModule(
                    self.model,
                    batch_size=self.spec.run.batch_size,
                    num_workers=ld.num_workers,
                    persistent_workers=ld.persistent_workers,
                    pin_memory=ld.pin_memory,
                    prefetch_factor=ld.prefetch_factor,
                    encoding=self.encoding,
                    layout=layout(self.spec),
                )
        return self._data_module

    def train(self, tz: Chunk) -> None:
        """One pass over the chunk's training rows, shuffled with the run's seed."""
        assert isinstance(tz, Tensorized)  # the reference model's chain tensorizes for it
        rows = torch.nonzero(tz.is_train).flatten()
        if rows.numel() == 0:
            return
        if self.optimizer is None:
            self.optimizer = self.model.configure_optimizer()
            if self._optimizer_state is not None:
                self.optimizer.load_state_dict(self._optimizer_state)
        self.model.train()
        order = rows[torch.randperm(rows.numel(), generator=self._generator)]
        t = self.train_timings
        window = self.clock.window()  # per-batch spans; on CUDA one device sync per window
        with self.clock.measure() as wall:
            for part, n in self.timed_batches("train", t, self.batches(tz, order, shuffle=True), window):
                steady = t.in_steady_state
                recorded = functools.partial(self.record, "train", t, rows=n, part=part)
                with self.profiler.batch("train", steady), window.span(recorded):
                    with self.autocast():
                        outs = self.forward(part, outputs=("prediction",))
                        loss = self.model.loss(part, outs)
                    self.optimizer.zero_grad(set_to_none=True)
                    if self.scaler is not None:
                        self.scaler.scale(loss).backward()
                        self.scaler.step(self.optimizer)
                        self.scaler.update()
                    else:
                        loss.backward()
                        self.optimizer.step()
                window.batch_done(steady)
                t.updates += 1
            window.flush()
        self.wall_seconds += wall.seconds
        self.paths_seen.add(getattr(self.model, "last_encoder_path", "unknown"))

    def _count_batch(self, masks: list[tuple[int, torch.Tensor]]) -> Layout:
        """Coordinates the model received in one predict batch (``data.padded_coords``) and its
        padded branch lengths, from the batch's present masks (``present_masks``, kept by
        reference inside the timed loop): counted by ``settle``, after the compute stage."""
        present, padded = mask_coordinate_counts(masks)
        return present, padded, tuple(mask.shape[-1] for _, mask in masks[1:])

    @staticmethod
    def needed_outputs(outputs: tuple[str, ...]) -> tuple[str, ...]:
        """Model outputs to compute: the selected ones, plus the prediction head (quality
        needs it and top-k is derived from its logits)."""
        return tuple(dict.fromkeys(["prediction", *(o for o in outputs if not o.startswith("topk:"))]))

    @torch.no_grad()
    def predict(self, tz: Chunk, outputs: tuple[str, ...]) -> PredictOutputs:
        """Selected outputs for every root row; quality accumulates over validation rows."""
        assert isinstance(tz, Tensorized)
        self.model.eval()
        need = self.needed_outputs(outputs)
        parts: dict[str, list[torch.Tensor]] = {k: [] for k in need}
        inputs: list[Batch] = []  # loader mode: masks and labels come back with the batches
        t = self.predict_timings
        window = self.clock.window()
        with self.clock.measure() as wall:
            self._ran_rows = []
            bucketed = self.spec.run.bucketing == "by_length"
            for part, n in self.timed_batches("predict", t, self.batches(tz, torch.arange(tz.root_rows)), window):
                steady = t.in_steady_state
                recorded = functools.partial(self.record, "predict", t, rows=n, part=part)
                with self.profiler.batch("predict", steady), window.span(recorded):
                    outs = self.backend.step(part, need)
                    outs = {k: v.float().to("cpu", non_blocking=False) for k, v in outs.items()}
                window.batch_done(steady)
                # the batch's masks by reference: counted after the compute stage (``settle``)
                self.keep_layout(functools.partial(self._count_batch, present_masks(part, self.schema)))
                for k, v in outs.items():
                    parts[k].append(
                        bucketing.pad_back(v, self.schema, bucketing.output_node(k, self.schema)) if bucketed else v
                    )
                if tz.batch is None:
                    part = part.to("cpu")
                    inputs.append(bucketing.pad_batch_back(part, self.schema) if bucketed else part)
            window.flush()
        self.wall_seconds += wall.seconds
        self.paths_seen.add(self.backend.encoder_path())
        tensors = {k: torch.cat(v) for k, v in parts.items()}
        ran = torch.cat(self._ran_rows) if bucketed else None
        if ran is not None:  # rows ran grouped by length: back to the chunk's key order
            tensors = {k: bucketing.restore_order(v, ran) for k, v in tensors.items()}
        if tz.batch is not None:
            labels, label_present = tz.batch.labels, tz.batch.label_present
            present = {k: v.present for k, v in tz.batch.nodes.items()}
        else:
            labels = torch.cat([b.labels for b in inputs])
            label_present = torch.cat([b.label_present for b in inputs])
            present = {k: torch.cat([b.nodes[k].present for b in inputs]) for k in inputs[0].nodes}
            if ran is not None:
                labels, label_present = (bucketing.restore_order(x, ran) for x in (labels, label_present))
                present = {k: bucketing.restore_order(v, ran) for k, v in present.items()}
        scored = tz.is_scored
        mask = label_present & scored.view(-1, *([1] * (labels.dim() - 1)))
        self.quality.keep(tensors["prediction"], labels, mask, tz.keys, scored)  # scored by ``settle``
        return PredictOutputs(tensors, present, labels=labels, label_mask=mask)

    @torch.no_grad()
    def validation_logits(self, tz: Chunk, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert isinstance(tz, Tensorized)
        xs, ys = [], []
        self.model.eval()
        for part, _ in self.batches(tz, rows):
            with self.autocast():
                logits = self.model(part, outputs=("prediction",))["prediction"]
            mask = part.label_present.bool()
            xs.append(logits.float()[mask].cpu())
            ys.append(part.labels[mask].cpu())
        return torch.cat(xs), torch.cat(ys)

    def target_present(self, outs: PredictOutputs) -> torch.Tensor:
        pred = outs.tensors["prediction"]
        path = self.schema.path(self.schema.target.node)[1:]
        mask = outs.present[path[-1].name] if path else torch.ones(pred.shape[0], dtype=torch.bool)
        return mask.reshape(*mask.shape, *([1] * (pred.dim() - mask.dim()))).expand_as(pred)

    def predictions_table(self, keys: pa.Array, outs: PredictOutputs) -> pa.Table:
        assert self.encoding is not None
        return to_table(self.spec, self.schema, self.encoding, keys, outs)

    def save_checkpoint(self, path: Path, spec: Spec) -> None:
        assert self.encoding is not None  # set with the schema
        save_run_checkpoint(path, self, self.encoding, spec)

    def _on_meta(self, outputs: tuple[str, ...]) -> dict[str, int]:
        """Parameters and reserved-shape FLOPs per root row of ``outputs`` (once per outputs)."""
        if outputs not in self._meta:
            self._meta[outputs] = inspect_on_meta(self.schema, self.model.config, outputs=outputs)
        return self._meta[outputs]

    def facts(self) -> ModelFacts:
        shape = self._on_meta(self.needed_outputs(tuple(self.spec.task.outputs)))
        return ModelFacts("reference", int(shape["parameters"]), int(shape["flops_per_root_row"]))

    def present_flops(self, phase: str) -> tuple[float, float]:
        """Training computes the prediction head only; predict every needed output."""
        outputs = self.needed_outputs(tuple(self.spec.task.outputs)) if phase == "predict" else ("prediction",)
        reserved = float(self._on_meta(outputs)["flops_per_root_row"])
        return reserved, flops_of_shapes(self.schema, self.model.config, outputs, self.steady_shapes[phase])
