"""The model side of relational-transformers 0.1.0, as the harness's compute engine drives it.

The harness owns batching and clocks; ``RTDriver`` turns one collated ``RelationalBatch``
into scores, probabilities or a training step, always through the library's own objects:
``RelationalTransformer`` (loading, ``predict``, ``task_head`` serving, ONNX export),
``RTJModel``, ``TaskHead``, ``loss_for``, its ONNX backend and its checkpoint loader.

- Size: ``model.layers/d_model/heads`` -> ``RTJModel(num_blocks, d_model, d_text=384,
  num_heads, d_ff=4 * d_model)`` (RT-J's own ratio: the published size is 12 blocks, d 512,
  8 heads, d_ff 2048: ``RT_J``). The fresh model's random weights are written as a local
  checkpoint and loaded through the library's constructor, so a fresh model and a real
  checkpoint take the same path. ``checkpoint=DIR`` (a local checkpoint folder) sets the size
  from its config instead; a path that does not exist is a ``UserError`` naming it: the
  library would hand any string that is not a local path to the Hugging Face hub.
- Training, per batch (the library's ``RelationalTrainer`` owns its own batching: it
  shuffles and re-collates its examples, so the harness could not bucket or time it): the
  trainer's step, reproduced (AdamW over every parameter, gradient clipping at 1.0, the
  library's loss for the problem type). Binary and regression fine-tune the whole model
  through the published scalar decoder (``target_scores``). Category targets: a head over
  the backbone, trained with it end to end: the library's ``TaskHead(d_model, classes,
  "multiclass")`` over ``target_features`` with its multiclass cross-entropy, registered in
  ``transformer.heads`` and served by ``predict(..., task_head=...)``. Chosen over the frozen
  head path (``fit_head`` / ``fit_feature_head``) because no pretrained RT-J can be fetched
  here: frozen random features are what a frozen head would fit (README: measured).
- Weight files: fp32/fp16/fp8/int8/int4 in the layout ``checkpoints.load_state`` reads;
  fp8/int8/int4 by relational-transformers-utils' quantizer (0.1.0 ships the loader only).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import torch
from relational_transformers import RelationalBatch, RelationalTransformer, RTJModel, TaskHead
from relational_transformers.checkpoints import model_dimensions, resolve_checkpoint, save_checkpoint
from relational_transformers.losses import loss_for
from relational_transformers.onnx import OnnxBackend, export_onnx
from relational_transformers.torch_model import ModelOutput
from relational_transformers_utils.quantization import quantize_checkpoint
from torch.utils.flop_counter import FlopCounterMode

from tasks.backends.onnxruntime import session_threads
from tasks.libraries.relational_transformers.checks import LIBRARY, Refusal, check, refusals
from tasks.libraries.relational_transformers.contexts import D_TEXT, Stats
from tasks.measure.cell_flops import FlopModel
from tasks.runtime.errors import UserError
from tasks.spec import Spec

__all__ = [
    "HEAD",
    "LIBRARY",
    "RT_J",
    "FlopCount",
    "MetaReport",
    "ModelDims",
    "OnnxDriver",
    "QUANTIZED_FORMATS",
    "RTDriver",
    "SavedCheckpoint",
    "WeightFormat",
    "Refusal",
    "check",
    "checkpoint_dir",
    "first_cell",
    "dims_of",
    "inspect_meta",
    "refusals",
    "write_weights",
]

HEAD = "target"  # the name of the category head in transformer.heads
STATS_FILE = "relflow_stats.json"
HEAD_DIR = "head"
WeightFormat = Literal["fp32", "fp16", "fp8", "int8", "int4"]
Kind = Literal["category", "binary", "regression"]


@dataclass(frozen=True)
class ModelDims:
    num_blocks: int
    d_model: int
    num_heads: int
    d_ff: int
    d_text: int = D_TEXT

    def config(self) -> dict[str, int]:
        return asdict(self)


RT_J = ModelDims(num_blocks=12, d_model=512, num_heads=8, d_ff=2048)
"""The published RT-J size (85.6M parameters), e.g. ``--set model.layers=12 --set
model.d_model=512 --set model.heads=8``."""


def dims_of(spec: Spec) -> ModelDims:
    m = spec.model
    return ModelDims(num_blocks=m.layers, d_model=m.d_model, num_heads=m.heads, d_ff=4 * m.d_model)


def _task(kind: str) -> str:
    # the library's checkpoint folders: regression/ or classification/ (its `task` argument)
    return "regression" if kind == "regression" else "classification"


def checkpoint_dir(path: str | Path, key: str = "run.checkpoint") -> Path:
    """A local checkpoint folder, or a ``UserError`` naming ``path``: never a hub lookup."""
    p = Path(path).expanduser()
    if not p.is_dir():
        what = "does not exist" if not p.exists() else "is not a folder"
        raise UserError(
            f"model.library {LIBRARY}: {key} '{path}' {what}. The library would look any path it cannot "
            "find up on the Hugging Face hub, which this harness never does: give the local folder that "
            "holds config.json and model.safetensors (RelationalTransformer.save_pretrained's layout)"
        )
    if not any((d / "config.json").is_file() for d in (p, p / "classification", p / "regression")):
        raise UserError(
            f"model.library {LIBRARY}: {key} '{path}' has no config.json (nor classification/ or "
            "regression/ with one); give a folder written by save_pretrained or the harness"
        )
    return p


@contextmanager
def _offline() -> Iterator[None]:
    # belt and braces: checkpoint_dir already refuses anything that is not local
    before = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = before


def _device(spec: Spec) -> torch.device:
    if spec.run.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec.run.device)


def _bare(model: torch.nn.Module) -> RTJModel:
    """The ``RTJModel`` under a ``torch.compile`` wrapper (state dicts, FLOPs, export)."""
    inner = getattr(model, "_orig_mod", model)
    return cast(RTJModel, inner)


def first_cell(batch: RelationalBatch) -> dict[str, torch.Tensor]:
    """The first context's first cell of ``batch``, every field ``[1, 1, ...]`` (for
    ``RTDriver.flop_model``; a copy, so the batch can be freed)."""
    return {name: t[:1, :1].clone() for name, t in batch.as_dict().items()}


@dataclass(frozen=True)
class FlopCount:
    flops: int | None  # one forward of the batch, as torch's FlopCounterMode counts it
    reason: str | None = None  # why there is no count


@dataclass(frozen=True)
class SavedCheckpoint:
    directory: Path
    weights: WeightFormat
    weight_file_bytes: int  # model.safetensors
    total_bytes: int  # everything in the folder (config, head, statistics)
    quantized_tensors: int  # tensors stored below 16 bits (fp8/int8/int4)


class _HeadedModel(torch.nn.Module):
    """RT-J's target features through the category head, shaped as the library's export
    expects (``model(batch, output="target_scores").scores``): the library's ONNX exporter
    and backend then serve the multiclass logits."""

    def __init__(self, model: RTJModel, head: TaskHead) -> None:
        super().__init__()
        self.model, self.head = model, head

    def forward(self, batch: Any, output: str = "target_scores") -> ModelOutput:
        features = self.model(batch, output="target_features").features
        assert features is not None
        return ModelOutput(scores=self.head(features))


class RTDriver:
    """One RT-J model under the harness: predict and train per batch, save, export, count."""

    def __init__(self, transformer: RelationalTransformer, spec: Spec, stats: Stats) -> None:
        self.transformer = transformer
        self.spec = spec
        self.stats = stats
        self.kind: Kind = spec.task.kind
        self._optimizer: torch.optim.Optimizer | None = None

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def from_spec(
        cls,
        spec: Spec,
        stats: Stats | None = None,
        *,
        checkpoint: str | Path | None = None,
        device: str | torch.device | None = None,
    ) -> RTDriver:
        """The model ``spec`` asks for: fresh at ``model.*`` size (seeded by ``run.seed``), or
        the local checkpoint ``checkpoint`` (default ``run.checkpoint``) with its own size and,
        when it holds them, the statistics it was trained with."""
        checkpoint = checkpoint if checkpoint is not None else spec.run.checkpoint
        dev = torch.device(device) if device is not None else _device(spec)
        compile_model = spec.run.compile.model
        if checkpoint is None:
            if stats is None:
                raise UserError(f"model.library {LIBRARY}: a fresh model needs the training statistics (fit_stats)")
            work = Path(tempfile.mkdtemp(prefix="relflow-rt-"))
            try:
                with torch.random.fork_rng():
                    torch.manual_seed(spec.run.seed)
                    d = dims_of(spec)
                    model = RTJModel(d.num_blocks, d.d_model, d.d_text, d.num_heads, d.d_ff)
                save_checkpoint(model, work, dims_of(spec).config())
                del model
                with _offline():
                    transformer = RelationalTransformer(
                        work, task=_task(spec.task.kind), device=dev, compile=compile_model
                    )
            finally:
                shutil.rmtree(work, ignore_errors=True)
            driver = cls(transformer, spec, stats)
            if spec.task.kind == "category":
                driver._new_head(spec.run.seed)
            return driver

        folder = checkpoint_dir(checkpoint)
        with _offline():
            transformer = RelationalTransformer(folder, task=_task(spec.task.kind), device=dev, compile=compile_model)
        saved = folder / STATS_FILE
        if saved.is_file():
            stats = Stats.from_json(saved.read_text())
        elif stats is None:
            raise UserError(
                f"model.library {LIBRARY}: checkpoint '{checkpoint}' has no {STATS_FILE} (the normalisation "
                "it was trained with); pass the statistics from fit_stats"
            )
        driver = cls(transformer, spec, stats)
        if spec.task.kind == "category":
            head_dir = folder / HEAD_DIR
            if not (head_dir / "head_config.json").is_file():
                raise UserError(
                    f"model.library {LIBRARY}: checkpoint '{checkpoint}' has no category head ({HEAD_DIR}/); "
                    "a category target needs the head trained with it: train it with the harness first"
                )
            head = TaskHead.from_pretrained(head_dir).to(dev).eval()
            if head.num_labels != len(stats.classes):
                raise UserError(
                    f"model.library {LIBRARY}: checkpoint '{checkpoint}' has a head for {head.num_labels} "
                    f"classes but the statistics list {len(stats.classes)}; use the statistics saved with it"
                )
            transformer.heads[HEAD] = head
        return driver

    def _new_head(self, seed: int) -> None:
        n = len(self.stats.classes)
        if n < 2:
            raise UserError(
                f"model.library {LIBRARY}: task.target '{self.spec.task.target}' has {n} class(es) in the "
                "training split; a category target needs at least 2 (or use task.kind binary/regression)"
            )
        with torch.random.fork_rng():
            torch.manual_seed(seed + 1)
            head = TaskHead(self.model.d_model, n, "multiclass")
        self.transformer.heads[HEAD] = head.to(self.transformer.device).eval()

    # --- what it is --------------------------------------------------------------------------

    @property
    def model(self) -> RTJModel:
        assert self.transformer.model is not None
        return _bare(self.transformer.model)

    @property
    def head(self) -> TaskHead | None:
        head = self.transformer.heads.get(HEAD)
        return cast(TaskHead, head) if head is not None else None

    @property
    def dims(self) -> ModelDims:
        d = model_dimensions(self.transformer.config)
        return ModelDims(d["num_blocks"], d["d_model"], d["num_heads"], d["d_ff"], d["d_text"])

    def parameters(self) -> int:
        total = sum(p.numel() for p in self.model.parameters())
        head = self.head
        return total + (sum(p.numel() for p in head.parameters()) if head is not None else 0)

    # --- predict ---------------------------------------------------------------------------

    def scores(self, batch: RelationalBatch) -> torch.Tensor:
        """Logits in batch-row order: binary [B], category [B, classes], regression [B]
        (normalised units): what calibration fits a temperature on."""
        task_head = HEAD if self.kind == "category" else None
        out = self.transformer.predict(batch, task_head=task_head, activation="identity", convert_to_numpy=False)
        return cast(torch.Tensor, out).float().cpu()

    def predict(self, batch: RelationalBatch) -> torch.Tensor:
        """Per batch row: binary P(true) [B], category class probabilities [B, classes]
        (``stats.classes`` order), regression the value in the target's units [B]."""
        return _activate(self.kind, self.scores(batch), self.stats)

    # --- train -----------------------------------------------------------------------------

    def _trainable(self) -> list[torch.nn.Parameter]:
        params = list(self.model.parameters())
        head = self.head
        return params + (list(head.parameters()) if head is not None else [])

    def train_step(self, batch: RelationalBatch, labels: torch.Tensor, present: torch.Tensor) -> float:
        """One optimiser step on the batch rows whose label is present; returns the loss
        (NaN, and no step, when no row has a label)."""
        keep = present.bool().to(self.transformer.device)
        if not bool(keep.any()):
            return float("nan")
        if self._optimizer is None:
            run = self.spec.run
            # the library's trainer: AdamW over every parameter (no decay exemptions)
            self._optimizer = torch.optim.AdamW(
                self._trainable(), lr=run.learning_rate, weight_decay=run.adamw.weight_decay, fused=run.adamw.fused
            )
        assert self.transformer.model is not None
        module = self.transformer.model  # the compiled one when run.compile.model
        module.train()
        try:
            batch = batch.to(self.transformer.device)
            y = labels.to(self.transformer.device)
            head = self.head
            if self.kind == "category":
                assert head is not None
                head.train()
                features = module(batch, output="target_features").features
                logits, y = head(features), y.long()
                problem = "multiclass"
            else:
                logits = module(batch, output="target_scores").scores
                problem = "binary" if self.kind == "binary" else "regression"
            loss = loss_for(problem)(logits[keep], y[keep])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self._trainable(), 1.0)
            self._optimizer.step()
            self._optimizer.zero_grad(set_to_none=True)
        finally:
            module.eval()
            if self.head is not None:
                self.head.eval()
        return float(loss.detach())

    # --- save -------------------------------------------------------------------------------

    def save(self, directory: str | Path, weights: WeightFormat = "fp32") -> SavedCheckpoint:
        """The model in ``weights`` format (the library's loader reads every one), its category
        head and the statistics, as one folder that ``from_spec(checkpoint=...)`` loads."""
        folder = Path(directory)
        state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        quantized = write_weights(state, folder, {**self.transformer.config, **self.dims.config()}, weights)
        head = self.head
        if head is not None:
            head.cpu().save_pretrained(folder / HEAD_DIR)
            head.to(self.transformer.device)
        (folder / STATS_FILE).write_text(self.stats.to_json())
        total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        return SavedCheckpoint(folder, weights, (folder / "model.safetensors").stat().st_size, total, quantized)

    # --- count ------------------------------------------------------------------------------

    def flops(self, batch: RelationalBatch) -> FlopCount:
        """FLOPs of one forward over ``batch`` (matrix products and attention as torch's
        FlopCounterMode counts them; masks and elementwise work are not counted)."""
        counter = FlopCounterMode(display=False)
        batch = batch.to(self.transformer.device)
        with counter, torch.no_grad():
            if self.kind == "category":
                head = self.head
                assert head is not None
                _HeadedModel(self.model, head)(batch)
            else:
                self.model(batch, output="target_scores")
        return FlopCount(int(counter.get_total_flops()))

    def flop_model(self, cell: dict[str, torch.Tensor]) -> FlopModel | None:
        """FLOPs of one forward as a function of the padded length (tasks/measure/cell_flops.py),
        from ``flops`` of one context of ``first_cell``'s cell repeated to 1, 2, 3 and 4 cells
        (FlopCounterMode counts shapes, not values); ``None`` when the counts do not follow
        that form."""
        counts: dict[int, int] = {}
        for n in (1, 2, 3, 4):
            fields = {name: t.expand(1, n, *t.shape[2:]).clone() for name, t in cell.items()}
            fields["is_padding"] = torch.zeros(1, n, dtype=torch.bool)
            fields["is_targets"] = torch.arange(n).eq(0).unsqueeze(0)  # one target cell
            count = self.flops(RelationalBatch(**fields)).flops
            if count is None:
                return None
            counts[n] = count
        return FlopModel.fit(counts)

    # --- ONNX -------------------------------------------------------------------------------

    def export_onnx(self, path: str | Path, example: RelationalBatch) -> Path:
        """ONNX with dynamic batch and cell axes, through the library's exporter (opset 18).
        Category: the backbone and the head as one graph, the same exporter."""
        path = Path(path)
        if self.kind == "category":
            head = self.head
            assert head is not None
            model = _HeadedModel(self.model, head.cpu()).eval()
            export_onnx(model, example.to("cpu"), path)
            head.to(self.transformer.device)
            return path
        bare = self.model.cpu().eval()
        try:
            export_onnx(bare, example.to("cpu"), path)
        finally:
            bare.to(self.transformer.device)
        return path

    def onnx(
        self,
        path: str | Path,
        *,
        providers: Sequence[str] = ("CPUExecutionProvider",),
        intra_op_threads: int = 0,
        inter_op_threads: int = 0,
        graph_optimization_level: str = "all",
    ) -> OnnxDriver:
        """A driver serving the exported file ``path`` through the library's ONNX backend."""
        return OnnxDriver(
            path,
            self.kind,
            self.stats,
            providers=providers,
            intra_op_threads=intra_op_threads,
            inter_op_threads=inter_op_threads,
            graph_optimization_level=graph_optimization_level,
        )


def _activate(kind: str, scores: torch.Tensor, stats: Stats) -> torch.Tensor:
    if kind == "binary":
        return torch.sigmoid(scores)
    if kind == "category":
        return torch.softmax(scores, dim=-1)
    return scores * stats.target_std + stats.target_mean


class _ThreadedOnnxBackend(OnnxBackend):
    """The library's ONNX backend with session options: its constructor takes ``providers``
    only, so ONNX Runtime would pick its own thread count (one per physical core). Its
    ``predict`` (the input conversion) is inherited unchanged."""

    def __init__(self, path: Path, providers: Sequence[str], options: Any) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(path), sess_options=options, providers=list(providers))


class OnnxDriver:
    """Serving an exported RT-J through the library's ONNX backend (target scores only)."""

    def __init__(
        self,
        path: str | Path,
        kind: Kind,
        stats: Stats,
        *,
        providers: Sequence[str] = ("CPUExecutionProvider",),
        intra_op_threads: int = 0,
        inter_op_threads: int = 0,
        graph_optimization_level: str = "all",
    ) -> None:
        import onnxruntime as ort

        file = Path(path).expanduser()
        if file.is_dir():
            file = file / "model.onnx"
        if not file.is_file():
            raise UserError(
                f"model.library {LIBRARY}: the ONNX file '{path}' does not exist; the library would look it up "
                "on the Hugging Face hub, which this harness never does: export one first"
            )
        options = ort.SessionOptions()
        # 0 means like for like with torch, as the harness's run.onnxruntime.intra_op_threads
        # does: torch's count now, when the session is made (in a train+predict run, the
        # calibration fit's, the process's, not a request scenario's serving count)
        asked = intra_op_threads or torch.get_num_threads()
        options.intra_op_num_threads = asked
        options.inter_op_num_threads = inter_op_threads
        options.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[graph_optimization_level]
        self.path = file
        self.kind: Kind = kind
        self.stats = stats
        self.backend = _ThreadedOnnxBackend(file, providers, options)
        # what the session has, fixed now: its predict compute runs at it whatever torch's
        # count is then (the run's MFU peak and floors use it: EngineBase.session_threads)
        self.intra_op_threads = session_threads(self.backend.session, asked)
        # what the session runs on (the reference's relflow.providers tag reads the same)
        self.providers = tuple(self.backend.session.get_providers())

    def scores(self, batch: RelationalBatch) -> torch.Tensor:
        return torch.from_numpy(np.asarray(self.backend.predict(batch), dtype=np.float32))

    def predict(self, batch: RelationalBatch) -> torch.Tensor:
        return _activate(self.kind, self.scores(batch), self.stats)

    def flops(self, batch: RelationalBatch) -> FlopCount:
        return FlopCount(
            None,
            "ONNX Runtime runs the graph outside torch, so FlopCounterMode sees no operator; "
            "count the same batch on the PyTorch driver (the graph is the same model)",
        )


# --- weight files ---------------------------------------------------------------------------


class _StateDict:
    """What the library's ``save_checkpoint`` reads from a model: ``state_dict()``."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self._state = state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._state


QUANTIZED_FORMATS: tuple[WeightFormat, ...] = ("fp8", "int8", "int4")
"""Written by relational-transformers-utils' quantizer (``quantize_checkpoint``), not ours."""


def _stored_below_16_bits(path: Path) -> tuple[int, str | None]:
    """How many tensors of a safetensors file are stored below 16 bits (fp8 matrices, int8
    matrices with a ``q_scale``, int4 ones with a ``q4_scale``) and the file's
    ``quantization`` metadata (relational-transformers-utils writes its format's label)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        names: list[str] = list(handle.keys())
        meta = handle.metadata() or {}
        fp8 = sum(1 for n in names if handle.get_slice(n).get_dtype() in ("F8_E4M3", "F8_E5M2"))
    scaled = sum(1 for n in names if n.endswith((".q_scale", ".q4_scale")))
    return fp8 + scaled, meta.get("quantization")


def write_weights(
    state: dict[str, torch.Tensor], directory: Path, config: dict[str, Any], weights: WeightFormat
) -> int:
    """``state`` as ``model.safetensors`` + ``config.json`` in ``weights`` format; returns how
    many tensors are stored below 16 bits.

    fp32 as is and fp16 (every float tensor) through the library's ``save_checkpoint``.
    fp8/int8/int4 are relational-transformers-utils' files: the fp32 file written first, then
    its ``quantize_checkpoint`` (what ``rt-quantize`` writes per task folder): only 2-D
    ``*.weight`` matrices change (fp8: e4m3 with no scale; int8: ``q_scale`` per row; int4:
    nibbles + ``q4_scale``, widths that are a multiple of 32 only); every other tensor stays as
    ``state`` holds it (fp32). The config records ``weight_format`` and, as ``rt-quantize``
    does, ``quantization`` (the file's label, matrix weights only). README: the differences
    from the quantizer this replaced.
    """
    directory = Path(directory)
    if weights not in QUANTIZED_FORMATS:
        out = {
            n: (t.half() if weights == "fp16" and t.is_floating_point() else t).contiguous() for n, t in state.items()
        }
        save_checkpoint(_StateDict(out), directory, {**config, "weight_format": weights})
        return 0
    save_checkpoint(_StateDict(state), directory, {**config, "weight_format": weights})
    target = directory / "model.safetensors"
    source = directory / "model.fp32.safetensors"
    target.replace(source)
    try:
        quantize_checkpoint(source, target, fmt=weights)
    finally:
        source.unlink(missing_ok=True)
    count, label = _stored_below_16_bits(target)
    meta = directory / "config.json"
    written = json.loads(meta.read_text())
    written["quantization"] = {"format": label, "matrix_weights_only": True}
    meta.write_text(json.dumps(written, indent=2) + "\n")
    return count


# --- meta inspection --------------------------------------------------------------------------


@dataclass(frozen=True)
class MetaReport:
    dims: ModelDims
    total: int
    per_block: tuple[int, ...]
    encoders: int  # cell and column-name encoders, their norms, the mask embeddings
    decoders: int
    norm_out: int
    on_meta: bool  # every parameter on the meta device: nothing was allocated
    legacy_attention: bool  # a checkpoint without attention gates (wg, scale), as the torch backend sees it


def _legacy_weights(folder: Path, kind: str) -> bool:
    """Whether a checkpoint's weights lack the attention gates, read from the safetensors
    header only: the torch backend decides it from the weight names, the meta backend (config
    only) always assumes gates and over-counts such a checkpoint."""
    from safetensors import safe_open

    _, weights = resolve_checkpoint(folder, task=_task(kind))
    if weights.suffix != ".safetensors":
        return False
    with safe_open(str(weights), framework="pt") as handle:
        names: list[str] = handle.keys()  # a safe_open handle is not iterable itself
    return not any(name.endswith(".wg.weight") for name in names)


def inspect_meta(
    dims: ModelDims | None = None, *, checkpoint: str | Path | None = None, kind: str = "binary"
) -> MetaReport:
    """Parameter counts per block through the library's meta backend (``backend="meta"``):
    the architecture of ``dims``, or of a local checkpoint's config, without weight storage.
    A checkpoint without attention gates is counted as the torch backend would build it."""
    work: Path | None = None
    legacy = False
    if checkpoint is not None:
        source = checkpoint_dir(checkpoint)
        legacy = _legacy_weights(source, kind)
    else:
        assert dims is not None, "inspect_meta needs dims or a checkpoint"
        work = Path(tempfile.mkdtemp(prefix="relflow-rt-meta-"))
        (work / "config.json").write_text(json.dumps(dims.config()))
        source = work
    try:
        with _offline():
            meta = RelationalTransformer(source, backend="meta", task=_task(kind), device="cpu")
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    d = meta.get_model_kwargs()
    model = meta.model
    if legacy:
        model = RTJModel(**d, legacy_attn=True, device="meta")
    assert model is not None

    def count(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    return MetaReport(
        dims=ModelDims(d["num_blocks"], d["d_model"], d["num_heads"], d["d_ff"], d["d_text"]),
        total=count(model),
        per_block=tuple(count(b) for b in model.blocks),
        encoders=count(model.enc_dict) + count(model.norm_dict) + sum(p.numel() for p in model.mask_embs.values()),
        decoders=count(model.dec_dict),
        norm_out=count(model.norm_out),
        on_meta=all(p.is_meta for p in model.parameters()),
        legacy_attention=legacy,
    )
