"""What relflow 0.4.0 cannot honour in a spec, decided from the spec alone.

Imported by the checks before work (``tasks/run/checks/preflight.py``), before torch, Prefect or
relflow are (``import relflow`` brings Lightning: seconds): so nothing here imports them.
"""

from __future__ import annotations

import hashlib
import re

from tasks.libraries.base import Unsupported, harness_problems
from tasks.runtime.errors import UserError
from tasks.spec import Spec

__all__ = ["LIBRARY", "TRAIN_COLUMN", "TREND_SUFFIX", "check", "problems"]

LIBRARY = "relflow"
TRAIN_COLUMN = "__train"  # tasks/stages/split.py's TRAIN; not imported: no tasks.stages here
TREND_SUFFIX = "__epoch_days"
# relflow.structs.tree.Node.check_node_name: field and branch names are matched by name.
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_NOT_IN_NAMES = re.compile(r"[^A-Za-z0-9_-]")


def field_name(name: str) -> str:
    """The relflow field or branch name of a spec column or branch: the name itself when relflow
    accepts it (letters, digits, '_', '-'), else '_' for each other character plus '-' and 8 hex
    of the original's SHA-1, so two names that differ only there stay two fields. A user's column
    called ``Amount ($)`` is renamed by the harness, never by the user (as decimals are cast)."""
    if _NAME.match(name):
        return name
    return f"{_NOT_IN_NAMES.sub('_', name)}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def _model_problems(spec: Spec) -> list[Unsupported]:
    """Sizes relflow's attention cannot take."""
    out: list[Unsupported] = []
    model = spec.model
    if model.heads % 2:
        out.append(
            Unsupported(
                "model.heads",
                model.heads,
                "relflow requires an even number of attention heads (relflow.structs.tree.Node)",
                f"set model.heads to {model.heads + 1} (d_model {model.d_model} must stay divisible by it)",
            )
        )
    elif model.d_model // model.heads < 2:
        out.append(
            Unsupported(
                "model.heads",
                model.heads,
                f"relflow's rotary attention needs at least 2 dimensions per head (d_model {model.d_model})",
                "lower model.heads or raise model.d_model",
            )
        )
    return out


def _name_problems(spec: Spec) -> list[Unsupported]:
    """Branch overflow rules and the names relflow matches fields by."""
    out: list[Unsupported] = []
    names: list[tuple[str, str]] = [(f"schema.root.columns.{c}", c) for c in spec.schema_.root.columns]
    names.append(("task.target", spec.task.target))
    for b, _ in spec.schema_.walk():
        names.append((f"{b.name}.name", b.name))
        names.extend((f"{b.name}.columns.{c}", c) for c in b.columns)
        if b.overflow == "sample":
            out.append(
                Unsupported(
                    f"{b.name}.overflow",
                    "sample",
                    "relflow's Branch overflow rules are head, tail and error only (relflow.Overflow); "
                    "a sampled subset is not a relflow rule",
                    f"use --set {b.name}.overflow=keep_first (relflow head) or keep_last (relflow tail)",
                )
            )
    for key, name in names:
        if field_name(name).endswith(TREND_SUFFIX):
            out.append(
                Unsupported(
                    key,
                    name,
                    f"names ending in '{TREND_SUFFIX}' are the harness's trend-in-time numbers beside "
                    "each timestamp column",
                    "rename the column",
                )
            )
    return out


def _text_problems(spec: Spec) -> list[Unsupported]:
    """Text columns: relflow's Text field needs a hub model."""
    out: list[Unsupported] = []
    for node, columns in [("schema.root", spec.schema_.root.columns)] + [
        (b.name, b.columns) for b, _ in spec.schema_.walk()
    ]:
        for column, kind in columns.items():
            if kind == "text":
                out.append(
                    Unsupported(
                        f"{node}.columns.{column}",
                        "text",
                        "relflow's Text field runs a pretrained Hugging Face encoder (default "
                        "google/bert_uncased_L-2_H-128_A-2, loaded by AutoModel.from_pretrained) and "
                        "needs the relflow[text] extra (transformers); neither the package nor a model "
                        "can be fetched on this offline host",
                        "declare the column as category, or leave it out of the schema",
                    )
                )
    return out


def _output_problems(spec: Spec) -> list[Unsupported]:
    """Outputs relflow does not emit."""
    out: list[Unsupported] = []
    for output in spec.task.outputs:
        head, _, arg = output.partition(":")
        if head == "leaf":
            out.append(
                Unsupported(
                    "task.outputs",
                    output,
                    "relflow emits a branch's reduced vector (Branch(embed=True)) or per-field decoder "
                    "embeddings, not one vector per branch row; a per-row output would need "
                    "reduction=None, a different model",
                    f"use branch_embedding:{arg}, or drop {output}",
                )
            )
        elif head == "topk" and arg == "1":
            out.append(
                Unsupported(
                    "task.outputs",
                    output,
                    "relflow's Category top-k needs k > 1 (k = 1 is its prediction)",
                    "drop topk:1 (prediction is the top class) or ask for k >= 2",
                )
            )
    return out


def _run_problems(spec: Spec) -> list[Unsupported]:
    """Run settings relflow has no counterpart for."""
    out: list[Unsupported] = []
    run = spec.run
    if run.packing == "off":
        out.append(
            Unsupported(
                "run.packing",
                "off",
                "relflow packs present coordinates automatically and has no switch to turn it off "
                "(only active dropout or hooks on a region fall back to the padded path)",
                "use run.packing: auto",
            )
        )
    if run.backend != "pytorch":
        out.append(
            Unsupported(
                "run.backend",
                run.backend,
                "relflow 0.4.0 has no ONNX export and serves only through PyTorch"
                if run.backend == "onnxruntime"
                else "the Triton kernels are the reference model's own (model/), not relflow's",
                "use run.backend: pytorch",
            )
        )
    if run.compile.model:
        out.append(
            Unsupported(
                "run.compile.model",
                True,
                "relflow compiles regions (Model.compile(encoders=, pools=)); its forward validates "
                "and routes on the host (numpy, beartype, Python sets), which is not a whole-model graph",
                "use run.compile.encoders and/or run.compile.pools",
            )
        )
    if run.compile.mode is not None:
        out.append(
            Unsupported(
                "run.compile.mode",
                run.compile.mode,
                "relflow's Model.compile takes backend, dynamic and options, not a torch.compile mode",
                "drop run.compile.mode and pass Inductor settings in run.compile.options",
            )
        )
    if run.loader.num_workers > 0:
        out.append(
            Unsupported(
                "run.loader.num_workers",
                run.loader.num_workers,
                "relflow's ArrowDataModule workers are not wired: a training encode (strata=train) learns "
                "vocabularies in the workers through state relflow shares only inside a Lightning fit loop "
                "(its callbacks and bind component), and the harness's own loop encodes in its tensorize stage",
                "set run.loader.num_workers: 0",
            )
        )
    if run.distributed is not None:
        out.append(
            Unsupported(
                "run.distributed",
                "set",
                "the relflow driver trains in one process (relflow's own DDP goes through Lightning "
                "strategies the harness does not launch)",
                "drop run.distributed",
            )
        )
    if run.reference_checkpoint is not None:
        out.append(
            Unsupported(
                "run.reference_checkpoint",
                run.reference_checkpoint,
                "reduced-precision weight files are the reference model's format; relflow checkpoints "
                "are Model.save files",
                "drop run.reference_checkpoint",
            )
        )
    return out


def problems(spec: Spec) -> list[Unsupported]:
    """Every setting of ``spec`` relflow cannot honour; empty when it can run the spec."""
    out = [*_model_problems(spec), *_name_problems(spec), *_text_problems(spec)]
    out += [*_output_problems(spec), *_run_problems(spec)]
    # What the harness runs for the reference model only (one entry per key: relflow's own
    # reason above wins).
    seen = {p.key for p in out}
    return out + [p for p in harness_problems(spec) if p.key not in seen]


def check(spec: Spec) -> None:
    """Raise ``UserError`` (exit 2) naming every setting relflow cannot honour."""
    found = problems(spec)
    if found:
        raise UserError(" ".join(p.message(LIBRARY) for p in found))
