"""What relational-transformers 0.1.0 cannot honour in a spec, decided before any work.

Imports neither torch nor the library: ``relflow-bench run`` calls ``check`` before torch is
imported (tasks/run/checks/preflight.py), and a refused setting must exit in about a second. The
two library constants it needs are repeated here (a test holds them equal to the library's).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

from tasks.libraries.base import Unsupported
from tasks.runtime.errors import UserError
from tasks.spec import Spec

__all__ = [
    "D_TEXT",
    "LIBRARY",
    "MAX_PARENTS",
    "LinkMode",
    "Refusal",
    "check",
    "device_type",
    "refusals",
    "spec_graph_refusals",
]

LIBRARY = "relational_transformers"
D_TEXT = 384  # RT-J's d_text (relational_transformers: the published models' cell-vector width)
MAX_PARENTS = 5  # relational_transformers.constants.MAX_F2P: parent node ids per cell
LinkMode = Literal["parent", "ancestors"]
Refusal = Unsupported  # the one type of a refused setting (tasks/libraries/base.py); the old name, re-exported


def device_type(spec: Spec) -> str:
    """The run's device type without importing torch where it can be avoided: with
    ``run.device: auto`` and no NVIDIA driver loaded, torch could not see a GPU either."""
    if spec.run.device != "auto":
        return spec.run.device.split(":")[0]
    if "torch" not in sys.modules and not Path("/proc/driver/nvidia/version").exists():
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _checkpoint_blocks(path: str) -> int | None:
    """The block count in a local checkpoint's config; None when there is no such checkpoint."""
    folder = Path(path).expanduser()
    for d in (folder, folder / "classification", folder / "regression"):
        if (d / "config.json").is_file():
            # the library's model_dimensions: top-level keys, overridden by a "model" section
            config = json.loads((d / "config.json").read_text())
            blocks = {**config, **config.get("model", {})}.get("num_blocks")
            return int(blocks) if blocks is not None else None
    return None


def refusals(spec: Spec, *, links: LinkMode = "parent") -> list[Unsupported]:
    """Every setting of ``spec`` this library cannot honour, each with why and the fix.
    Reads only the spec and the local files it names (a checkpoint's config.json)."""
    checkpoints, blocks = _checkpoint_refusals(spec)
    return [
        *_task_refusals(spec),
        *_triton_refusals(spec),
        *_compile_refusals(spec),
        *_onnx_refusals(spec),
        *_run_refusals(spec),
        *_text_refusals(spec),
        *checkpoints,
        *_context_refusals(spec),
        # the nested layout's hops; the rt_utils builder's contexts follow the foreign-key graph
        *(_depth_refusals(spec, links, blocks) if spec.model.rt.context.builder == "nested" else []),
    ]


BUDGET_KEYS = (
    "max_context_cells",
    "local_context_cells",
    "bfs_width",
    "num_walks",
    "walk_length",
    "prefer_latest",
    "seed",
)


def _context_refusals(spec: Spec) -> list[Refusal]:
    """``model.rt.context``: what rt_utils cannot make a graph of; the budget is rt_utils'."""
    c, defaults = spec.model.rt.context, type(spec.model.rt.context)()
    if c.builder == "nested":
        # a budget key under nested would be ignored without a word: refused instead
        return [
            Refusal(
                f"model.rt.context.{k}",
                getattr(c, k),
                "the cell budget is read by the rt_utils builder only; the nested builder's contexts are the "
                "nested row (branches' max_length and overflow)",
                "set model.rt.context.builder: rt_utils, or remove the key",
            )
            for k in BUDGET_KEYS
            # against the defaults, not model_fields_set: a spec dumped and read back (the flow's
            # to_dict, a sweep's child) sets every key
            if getattr(c, k) != getattr(defaults, k)
        ]
    if spec.source.relbench is None:
        return spec_graph_refusals(spec)  # the spec's own schema as the graph
    if spec.source.database is not None:
        return [
            Refusal(
                "model.rt.context.builder",
                c.builder,
                "over a RelBench folder the rt_utils builder reads the folder's manifest (keys, time columns, the "
                "task's window) beside its db/ files, and a run over source.database does not know the folder",
                "remove source.database, or use model.rt.context.builder: nested",
            )
        ]
    return []


def spec_graph_refusals(spec: Spec) -> list[Refusal]:
    """What the rt_utils builder cannot make a foreign-key graph of, in a spec's own schema: a
    key that is also an input (the library keeps keys as identity, never a cell), a branch over
    the root's own table, and two branches over one table that disagree on its key, time or a
    foreign key's parent (one table is one set of nodes in the graph)."""
    root = spec.schema_.root
    out: list[Refusal] = []
    fix_nested = "or use model.rt.context.builder: nested"
    for key in dict.fromkeys(k for k in (root.key, root.entity) if k is not None):
        if key in root.columns:
            out.append(
                Refusal(
                    f"schema.root.columns.{key}",
                    root.columns[key],
                    "the rt_utils builder links the root's rows by this key; the library keeps a key as the row's "
                    "identity, never as a cell",
                    f"remove '{key}' from schema.root.columns, {fix_nested}",
                )
            )
    seen: dict[str, tuple[str, str | None, str | None]] = {}  # table -> (branch, key, time)
    parents: dict[tuple[str, str], str] = {}  # (table, parent_key) -> the parent's table
    for b, parent in spec.schema_.walk():
        if b.table == root.table:
            out.append(
                Refusal(
                    f"{b.name}.table",
                    b.table,
                    "the rt_utils builder makes the root's table the task's rows; a branch over that same table "
                    "would make one row two nodes",
                    f"read the branch from a copy of the table under another name, {fix_nested}",
                )
            )
        if b.key is not None and b.key in b.columns:
            out.append(
                Refusal(
                    f"{b.name}.columns.{b.key}",
                    b.columns[b.key],
                    "the branch's key links its nested branches' rows; the library keeps a key as the row's "
                    "identity, never as a cell",
                    f"remove '{b.key}' from the branch's columns, {fix_nested}",
                )
            )
        up = root.table if parent is None else next(x.table for x, _ in spec.schema_.walk() if x.name == parent)
        if parents.setdefault((b.table, b.parent_key), up) != up:
            out.append(
                Refusal(
                    f"{b.name}.parent_key",
                    b.parent_key,
                    f"another branch over table '{b.table}' makes '{b.parent_key}' point at table "
                    f"'{parents[(b.table, b.parent_key)]}', this one at '{up}': one column is one foreign key",
                    f"give one of the branches its own copy of the table, {fix_nested}",
                )
            )
        first = seen.setdefault(b.table, (b.name, b.key, b.time))
        for what, mine, theirs in (("key", b.key, first[1]), ("time", b.time, first[2])):
            if mine is not None and theirs is not None and mine != theirs:
                out.append(
                    Refusal(
                        f"{b.name}.{what}",
                        mine,
                        f"branch '{first[0]}' reads the same table '{b.table}' with {what} '{theirs}'; in the graph "
                        "a table has one key and one time column",
                        f"set the same {what} on both branches, {fix_nested}",
                    )
                )
    return out


def _task_refusals(spec: Spec) -> list[Unsupported]:
    """What the task asks that one target cell per root-row context cannot answer."""
    out: list[Unsupported] = []
    task = spec.task
    if task.branch is not None:
        out.append(
            Unsupported(
                "task.branch",
                task.branch,
                "a context holds exactly one target cell and one context is built per root row; a per-branch-row "
                "target would put several target cells in one context, and the library sums their scores into one",
                "predict a root column (leave task.branch unset)",
            )
        )
    extra = [o for o in task.outputs if o.partition(":")[0] not in ("prediction", "topk")]
    if extra:
        out.append(
            Unsupported(
                "task.outputs",
                extra,
                "RT-J serves one score (or class logits) per context; it has no pooled root, branch or leaf outputs",
                "keep prediction (and topk:<k> for a category target)",
            )
        )
    if task.target in spec.schema_.root.columns:
        out.append(
            Unsupported(
                f"schema.root.columns.{task.target}",
                spec.schema_.root.columns[task.target],
                "the target column would also be an input cell, so its value would leak into its own context",
                f"remove '{task.target}' from schema.root.columns",
            )
        )
    return out


def _triton_refusals(spec: Spec) -> list[Unsupported]:
    """run.backend triton, on any device."""
    out: list[Unsupported] = []
    run = spec.run
    if run.backend == "triton":
        device = device_type(spec)
        why = (
            f"the library's Triton backend (RTJTriton) needs CUDA: it moves every weight to the GPU with "
            f".cuda() and runs CUDA kernels, and this run's device is {device}"
            if device != "cuda"
            else "the library's Triton backend hard-codes RT-J's size (12 blocks, d 512) and fp16 weights and "
            "serves binary scores only; this harness has not wired it (it was built without a GPU)"
        )
        fix = "use run.backend pytorch or onnxruntime" + (" on this host" if device != "cuda" else "")
        out.append(Unsupported("run.backend", "triton", why, fix))
    return out


def _onnx_refusals(spec: Spec) -> list[Unsupported]:
    """The ONNX Runtime settings the library's ONNX backend lacks."""
    out: list[Unsupported] = []
    run = spec.run
    if run.backend != "onnxruntime":
        return out
    if run.onnxruntime.quantization is not None:
        out.append(
            Unsupported(
                "run.onnxruntime.quantization",
                run.onnxruntime.quantization,
                "the library's ONNX backend serves the exported file as it is",
                "drop run.onnxruntime.quantization",
            )
        )
    if run.onnxruntime.model is not None:
        p = Path(run.onnxruntime.model).expanduser()
        if not (p.is_file() or (p / "model.onnx").is_file()):
            out.append(
                Unsupported(
                    "run.onnxruntime.model",
                    run.onnxruntime.model,
                    "no such ONNX file or folder holding model.onnx; the library would look the name up on "
                    "the Hugging Face hub, which this harness never does",
                    "give a local .onnx file or folder, or drop the key to export the run's model",
                )
            )
    return out


def _compile_refusals(spec: Spec) -> list[Unsupported]:
    """run.compile beyond the library's one switch (compile=True) and run.precision."""
    out: list[Unsupported] = []
    c = spec.run.compile
    if c.encoders or c.pools:
        out.append(
            Unsupported(
                "run.compile.encoders/pools",
                {"encoders": c.encoders, "pools": c.pools},
                "RT-J has no separate encoder or pooling regions; the library compiles the whole model or nothing",
                "use run.compile.model: true (the library's compile=True) or leave compile off",
            )
        )
    if c.model and (c.backend != "inductor" or c.mode is not None or c.options or c.dynamic is False):
        out.append(
            Unsupported(
                "run.compile",
                {"backend": c.backend, "mode": c.mode, "options": c.options, "dynamic": c.dynamic},
                "the library's compile=True is torch.compile(model, dynamic=True) with nothing else to set",
                "leave run.compile.backend/mode/options/dynamic at their defaults",
            )
        )
    if spec.run.precision != "fp32":
        out.append(
            Unsupported(
                "run.precision",
                spec.run.precision,
                "the library's PyTorch backend always runs fp32: it builds the model in fp32 and loads any "
                "checkpoint into it (fp16, fp8, int8 and int4 files included)",
                "use run.precision fp32",
            )
        )
    return out


def _run_refusals(spec: Spec) -> list[Unsupported]:
    """One process, contexts built here, no dropout."""
    out: list[Unsupported] = []
    run = spec.run
    if run.distributed is not None:
        out.append(
            Unsupported(
                "run.distributed",
                "set",
                "the library trains in one process (its trainer has no data-parallel path)",
                "drop run.distributed",
            )
        )
    if run.loader.num_workers > 0:
        out.append(
            Unsupported(
                "run.loader.num_workers",
                run.loader.num_workers,
                "loader workers encode batches with the reference model's encoding; RT-J's contexts are "
                "built, encoded and collated by tasks/libraries/relational_transformers",
                "set run.loader.num_workers 0",
            )
        )
    if spec.model.dropout > 0:
        out.append(Unsupported("model.dropout", spec.model.dropout, "RT-J has no dropout", "set model.dropout 0"))
    return out


def _text_refusals(spec: Spec) -> list[Unsupported]:
    """Cell vectors are this folder's 384-wide encode step."""
    out: list[Unsupported] = []
    text = spec.run.text
    # the default width is the harness encoder's; any other value asks for a width RT-J cannot read
    # (fields_set would not do: a spec dumped and parsed again marks every default as set)
    if text.dim not in (type(text).model_fields["dim"].default, D_TEXT):
        out.append(
            Unsupported(
                "run.text.dim",
                text.dim,
                f"RT-J reads {D_TEXT}-wide cell vectors (its d_text)",
                f"drop run.text.dim or set it to {D_TEXT}",
            )
        )
    if text.encoder != "hashed":
        out.append(
            Unsupported(
                "run.text.encoder",
                text.encoder,
                f"this library's cells are encoded by its own encode step ({D_TEXT}-wide hashing encoder); "
                "a plug-in encoder is not wired for it",
                "use run.text.encoder hashed",
            )
        )
    return out


def _checkpoint_refusals(spec: Spec) -> tuple[list[Unsupported], int]:
    """Checkpoints that are not local folders, and the model's block count (the checkpoint's
    own when run.checkpoint names one, else model.layers)."""
    out: list[Unsupported] = []
    blocks = spec.model.layers
    for key in ("checkpoint", "reference_checkpoint"):
        value = getattr(spec.run, key)
        if value is None:
            continue
        found = _checkpoint_blocks(value)
        if found is None:
            out.append(
                Unsupported(
                    f"run.{key}",
                    value,
                    "no local checkpoint folder there (config.json, or classification/ or regression/ holding "
                    "one); the library would look the name up on the Hugging Face hub, which this harness never "
                    "does",
                    "give the local folder that holds config.json and model.safetensors",
                )
            )
        elif key == "checkpoint":
            blocks = found
    return out, blocks


def _depth_refusals(spec: Spec, links: LinkMode, blocks: int) -> list[Unsupported]:
    """Branches too deep: more parents than RT-J reads (ancestor links), or more foreign-key
    hops than blocks (parent links: their cells could never reach the prediction)."""
    out: list[Unsupported] = []
    for name, depth in _branch_depths(spec).items():
        if links == "ancestors" and depth > MAX_PARENTS:
            out.append(
                Unsupported(
                    f"branch '{name}' depth",
                    depth,
                    f"with ancestor links its rows carry {depth} parent node ids; RT-J reads at most {MAX_PARENTS}",
                    f"nest '{name}' at most {MAX_PARENTS} levels deep, or use parent links",
                )
            )
        elif links == "parent" and depth > blocks:
            out.append(
                Unsupported(
                    f"branch '{name}' depth",
                    depth,
                    f"its rows are {depth} foreign-key hops from the target cell; RT-J moves information "
                    f"one foreign-key hop per block, and the model has {blocks}: "
                    f"the cells of '{name}' would be read, encoded and attended over but could never "
                    "reach the prediction",
                    f"set model.layers to at least {depth}, or remove branch '{name}'",
                )
            )
    return out


def _branch_depths(spec: Spec) -> dict[str, int]:
    """Foreign-key hops from the root (the target's row) to each branch's rows."""
    depth: dict[str | None, int] = {None: 0}
    for branch, parent in spec.schema_.walk():
        depth[branch.name] = depth[parent] + 1
    return {name: d for name, d in depth.items() if name is not None}


def check(spec: Spec, *, links: LinkMode = "parent") -> None:
    """``UserError`` listing every setting of ``spec`` this library cannot honour (library,
    key, why, fix), before any data is read; None when it can run the spec as written."""
    found = refusals(spec, links=links)
    if found:
        raise UserError(" ".join(r.message(LIBRARY) for r in found))
