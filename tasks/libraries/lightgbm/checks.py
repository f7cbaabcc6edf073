"""What the LightGBM baseline cannot honour in a spec, decided from the spec alone.

Imported by the checks before work: nothing here imports lightgbm, torch or Polars. The
transformer's size and optimiser settings (``model.d_model|layers|heads|dropout``,
``run.learning_rate``, ``run.adamw``, ``run.packing``, ``run.bucketing``) describe a network
LightGBM does not have; they are not refused, and the run's ``relflow.library_model`` tag says
what was trained instead (README.md).
"""

from __future__ import annotations

from tasks.libraries.base import Unsupported, harness_problems
from tasks.runtime.errors import UserError
from tasks.spec import Spec

__all__ = ["LIBRARY", "check", "problems"]

LIBRARY = "lightgbm"


def _column_problems(spec: Spec) -> list[Unsupported]:
    out: list[Unsupported] = []
    nodes = [("schema.root", spec.schema_.root.columns)] + [(b.name, b.columns) for b, _ in spec.schema_.walk()]
    for node, columns in nodes:
        for column, kind in columns.items():
            if kind == "text":
                out.append(
                    Unsupported(
                        f"{node}.columns.{column}",
                        "text",
                        "the flattened aggregates are numbers and category counts; free text has no aggregate "
                        "here (RelBench's LightGBM reads text through a sentence encoder this host cannot fetch)",
                        "declare the column as category, or leave it out of the schema",
                    )
                )
    return out


def _run_problems(spec: Spec) -> list[Unsupported]:
    run, out = spec.run, list[Unsupported]()
    if run.backend != "pytorch":
        out.append(
            Unsupported(
                "run.backend",
                run.backend,
                "LightGBM predicts with its own trees (its C++ predictor); the ONNX and Triton paths serve "
                "the reference model's network",
                "use run.backend: pytorch (the library's own predictor)",
            )
        )
    compile_set = [k for k in ("encoders", "pools", "model") if getattr(run.compile, k)]
    if compile_set or run.compile.mode is not None:
        out.append(
            Unsupported(
                f"run.compile.{(compile_set or ['mode'])[0]}",
                True if compile_set else run.compile.mode,
                "a tree ensemble has no network regions to compile",
                "leave run.compile at its defaults",
            )
        )
    if run.precision != "fp32":
        out.append(
            Unsupported(
                "run.precision",
                run.precision,
                "LightGBM bins features and accumulates gradients in its own float32/float64 arithmetic",
                "use run.precision: fp32",
            )
        )
    if run.device not in ("auto", "cpu"):
        out.append(
            Unsupported(
                "run.device",
                run.device,
                "the PyPI wheel of LightGBM 4.7.0 trains and predicts on the CPU (its CUDA build is a "
                "separate compile)",
                "use run.device: cpu (or auto)",
            )
        )
    if run.mode == "predict" and not run.checkpoint:
        out.append(
            Unsupported(
                "run.mode",
                "predict",
                "a boosted ensemble is its trees: without run.checkpoint there is no model to predict with "
                "(no untrained weights to time)",
                "set run.checkpoint to a train+predict run's .ckpt, or use run.mode: train+predict",
            )
        )
    return out


def problems(spec: Spec) -> list[Unsupported]:
    """Every setting of ``spec`` LightGBM cannot honour, each with why and the fix."""
    return [*_column_problems(spec), *_run_problems(spec), *harness_problems(spec)]


def check(spec: Spec) -> None:
    """``UserError`` naming the library, the key and the fix for each refused setting."""
    found = problems(spec)
    if found:
        raise UserError(" ".join(p.message(LIBRARY) for p in found))
