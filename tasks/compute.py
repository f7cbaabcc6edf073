"""Stage 4, compute: train on the training split, then predict every root row.

``Engine`` holds the model, optimizer and per-phase timings for the whole run, so the
first call (lazy compilation included) and warm-up batches are counted once per phase, not
once per chunk. Each batch is timed in two parts with the synchronising clock: getting the
input ready (slicing the chunk, host->device copy) and the model step. The first part is
time the device waits for input (``device.input_wait_fraction``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field

import pyarrow as pa
import torch

from model import ModelConfig, RelationalTransformer, adamw
from model.arrow import Encoding
from model.batch import Batch
from model.data import ArrowDataModule
from model.precision import autocast_context
from model.schema import ModelSchema
from tasks.backends import Backend
from tasks.backends.pytorch import PyTorchBackend, whole_model
from tasks.clock import Clock
from tasks.errors import UserError
from tasks.quality import Quality
from tasks.records import PhaseTimings
from tasks.spec import Spec
from tasks.tensorize import Tensorized, layout


def compiled_frames() -> int:
    """Frames Dynamo has compiled so far in this process (each recompile adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"])


def graph_breaks() -> int:
    from torch._dynamo.utils import counters

    return int(sum(counters["graph_break"].values()))


def graph_break_reasons() -> dict[str, int]:
    """Dynamo's graph-break reasons so far in this process, with counts."""
    from torch._dynamo.utils import counters

    return {str(k): int(v) for k, v in counters["graph_break"].items()}


def resolve_device(spec: Spec) -> torch.device:
    name = spec.run.device
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"run.device is '{name}' but CUDA is not available here; use run.device: cpu.")
    return dev


def check_precision(spec: Spec, device: torch.device) -> None:
    if spec.run.precision == "fp16" and device.type == "cpu":
        raise UserError(
            "run.precision fp16 is not supported on CPU; use bf16 (supported on CPU) or fp32, "
            "or run on a CUDA device."
        )


@dataclass
class PredictOutputs:
    """Selected outputs of one chunk, on CPU, aligned with the chunk's root rows."""

    tensors: dict[str, torch.Tensor]
    present: dict[str, torch.Tensor] = field(default_factory=dict)  # node name -> present mask


class Engine:
    def __init__(self, spec: Spec, schema: ModelSchema, device: torch.device,
                 state_dict: dict | None = None, clock: Clock | None = None,
                 encoding: Encoding | None = None) -> None:
        self.spec, self.schema, self.device = spec, schema, device
        self.encoding = encoding  # loader workers encode with it
        torch.manual_seed(spec.run.seed)
        cfg = ModelConfig(d_model=spec.model.d_model, layers=spec.model.layers,
                          heads=spec.model.heads, dropout=spec.model.dropout)
        self.model = RelationalTransformer(schema, cfg).to(device)
        if state_dict is not None:
            self.model.load_state_dict(state_dict)
        self.model.packing = spec.run.packing
        c = spec.run.compile
        if c.encoders or c.pools:
            self.model.compile(encoders=c.encoders, pools=c.pools, backend=c.backend,
                               dynamic=c.dynamic)
        # The seed note's factory: fused AdamW by default (torch 2.13 has a CPU fused kernel).
        # The predict step runs through a backend (tasks/backends): PyTorch here; the flow may
        # swap in ONNX Runtime before predicting. run.compile.model compiles the whole model.
        self.forward = whole_model(self.model, c.backend) if c.model else self.model
        self.backend: Backend = PyTorchBackend(self.model, self.forward, self._autocast)
        self.model.optimizer = adamw(learning_rate=spec.run.learning_rate)
        self.model.batch_size = spec.run.batch_size
        self.optimizer_settings = self.model.optimizer
        self.optimizer: torch.optim.Optimizer | None = None
        self.clock = clock or Clock(device)
        bs, wu = spec.run.batch_size, spec.run.warmup_batches
        self.train_timings = PhaseTimings(wu, bs)
        self.predict_timings = PhaseTimings(wu, bs)
        self.wall_seconds = 0.0
        self.paths_seen: set[str] = set()
        self.quality = Quality(spec.task.kind)
        # Dynamo frame counts when each phase leaves warm-up: later growth = recompiles.
        self.frames_at_start = compiled_frames()
        self.frames_at_steady: dict[str, int] = {}
        self.breaks_at_steady: dict[str, int] = {}
        self.breaks_at_start: dict[str, int] = {}
        self._generator = torch.Generator().manual_seed(spec.run.seed)

    def _mark_steady(self, phase: str, t: PhaseTimings) -> None:
        if phase not in self.frames_at_steady and t.in_steady_state:
            self.frames_at_steady[phase] = compiled_frames()
            self.breaks_at_steady[phase] = graph_breaks()

    def recompiles(self, phase: str) -> int:
        return compiled_frames() - self.frames_at_steady.get(phase, compiled_frames())

    def graph_breaks_after_warmup(self, phase: str) -> int:
        return graph_breaks() - self.breaks_at_steady.get(phase, graph_breaks())

    def graph_breaks_in_warmup(self, phase: str) -> int:
        """Breaks while the phase compiled (first call and warm-up batches)."""
        now = graph_breaks()
        return self.breaks_at_steady.get(phase, now) - self.breaks_at_start.get(phase, now)

    def _autocast(self):
        if self.spec.run.precision == "fp32":
            return nullcontext()
        return autocast_context(self.device, self.spec.run.precision)

    def _input(self, batch: Batch, index: torch.Tensor) -> Batch:
        part = batch.select(index)
        if self.spec.run.loader.pin_memory and self.device.type == "cuda":
            part = part.pin_memory()
        return part.to(self.device, non_blocking=self.device.type == "cuda")

    def _batches(self, tz: Tensorized, rows: torch.Tensor) -> Iterator[tuple[Batch, int]]:
        """Device batches over root ``rows`` in order: sliced from the chunk's tensors, or
        encoded by ``ArrowDataModule`` workers when ``run.loader.num_workers > 0``."""
        bs = self.spec.run.batch_size
        if tz.batch is not None:
            for idx in rows.split(bs):
                yield self._input(tz.batch, idx), int(idx.numel())
            return
        assert tz.table is not None and self.encoding is not None
        table = tz.table.take(pa.array(rows.numpy()))
        ld = self.spec.run.loader
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pin_memory off CUDA is a no-op, said in the README
            dm = ArrowDataModule(self.model, validate=table, batch_size=bs, num_workers=ld.num_workers,
                                 persistent_workers=ld.persistent_workers, pin_memory=ld.pin_memory,
                                 prefetch_factor=ld.prefetch_factor, encoding=self.encoding,
                                 layout=layout(self.spec))
        for part in dm.val_dataloader():
            yield part, part.size

    def _timed(self, phase: str, t: PhaseTimings, batches: Iterator[tuple[Batch, int]]
               ) -> Iterator[tuple[Batch, int]]:
        """Yield batches, charging the wait for each one to ``t.input_seconds``."""
        self.breaks_at_start.setdefault(phase, graph_breaks())
        while True:
            self._mark_steady(phase, t)
            with self.clock.measure() as wait:
                item = next(batches, None)
            t.input_seconds += wait.seconds
            if item is None:
                return
            yield item

    def train(self, tz: Tensorized) -> None:
        """One pass over the chunk's training rows, shuffled with the run's seed."""
        rows = torch.nonzero(tz.is_train).flatten()
        if rows.numel() == 0:
            return
        if self.optimizer is None:
            self.optimizer = self.model.configure_optimizer()
        self.model.train()
        order = rows[torch.randperm(rows.numel(), generator=self._generator)]
        t = self.train_timings
        with self.clock.measure() as wall:
            for part, n in self._timed("train", t, self._batches(tz, order)):
                with self.clock.measure() as step:
                    with self._autocast():
                        outs = self.forward(part, outputs=("prediction",))
                        loss = self.model.loss(part, outs)
                    self.optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    self.optimizer.step()
                t.record(step.seconds, n)
                t.updates += 1
        self.wall_seconds += wall.seconds
        self.paths_seen.add(getattr(self.model, "last_encoder_path", "unknown"))

    @staticmethod
    def needed_outputs(outputs: tuple[str, ...]) -> tuple[str, ...]:
        """Model outputs to compute: the selected ones, plus the prediction head (quality
        needs it and top-k is derived from its logits)."""
        return tuple(dict.fromkeys(["prediction", *(o for o in outputs if not o.startswith("topk:"))]))

    @torch.no_grad()
    def predict(self, tz: Tensorized, outputs: tuple[str, ...]) -> PredictOutputs:
        """Selected outputs for every root row; quality accumulates over validation rows."""
        self.model.eval()
        need = self.needed_outputs(outputs)
        parts: dict[str, list[torch.Tensor]] = {k: [] for k in need}
        inputs: list[Batch] = []  # loader mode: masks and labels come back with the batches
        t = self.predict_timings
        with self.clock.measure() as wall:
            for part, n in self._timed("predict", t, self._batches(tz, torch.arange(tz.root_rows))):
                with self.clock.measure() as step:
                    outs = self.backend.step(part, need)
                    outs = {k: v.float().to("cpu", non_blocking=False) for k, v in outs.items()}
                t.record(step.seconds, n)
                for k, v in outs.items():
                    parts[k].append(v)
                if tz.batch is None:
                    inputs.append(part.to("cpu"))
        self.wall_seconds += wall.seconds
        self.paths_seen.add(self.backend.encoder_path())
        tensors = {k: torch.cat(v) for k, v in parts.items()}
        if tz.batch is not None:
            labels, label_present = tz.batch.labels, tz.batch.label_present
            present = {k: v.present for k, v in tz.batch.nodes.items()}
        else:
            labels = torch.cat([b.labels for b in inputs])
            label_present = torch.cat([b.label_present for b in inputs])
            present = {k: torch.cat([b.nodes[k].present for b in inputs]) for k in inputs[0].nodes}
        holdout = ~tz.is_train
        mask = label_present & holdout.view(-1, *([1] * (labels.dim() - 1)))
        self.quality.add(tensors["prediction"], labels, mask)
        return PredictOutputs(tensors, present)
