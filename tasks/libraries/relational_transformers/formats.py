"""RT-J weight formats side by side: write fp16/fp8/int8/int4 checkpoints from one local RT
checkpoint, then load each in a fresh process and measure it (``relflow-bench quantize`` on a
checkpoint folder). fp8/int8/int4 are relational-transformers-utils' quantizer's files
(``RTDriver.save`` -> ``driver.write_weights`` -> its ``quantize_checkpoint``); fp16 is ours.

Per format: the file's bytes, load seconds, the resident set before and after the load and
its peak during the load (``VmHWM`` reset just before loading, so imports are not in it), the
dtypes the parameters hold after the load, and the task metrics of the held-out rows,
compared against the fp16 file (the note's "always compare against fp16"). A fresh process
per format: a second load in one process would reuse the first one's freed allocator pages and
its resident set would say nothing.

The child (``python -m tasks.libraries.relational_transformers.formats REQUEST.json``) reads
its request, loads, measures, predicts the evaluation contexts batch by batch and writes its
figures (JSON) and scores (``.npy``).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tasks.libraries.relational_transformers.contexts import (
    Contexts,
    Encoded,
    build_contexts,
    collate,
    encode,
    plan_batches,
)
from tasks.libraries.relational_transformers.driver import (
    LIBRARY,
    STATS_FILE,
    RTDriver,
    SavedCheckpoint,
    WeightFormat,
    checkpoint_dir,
)
from tasks.measure.clock import Clock
from tasks.measure.memory import high_water_bytes, reset_high_water
from tasks.measure.quality import Quality
from tasks.runtime.errors import UserError
from tasks.spec import Spec, parse_spec

__all__ = [
    "QUANTIZED",
    "EvalSet",
    "Probe",
    "compare",
    "eval_set",
    "probe_in_fresh_process",
    "source_format",
    "write_formats",
]

QUANTIZED: tuple[WeightFormat, ...] = ("fp16", "fp8", "int8", "int4")  # fp16 first: the reference
EVAL_BATCH = 64  # contexts per predict batch in the child (collated as served, by length)


def source_format(folder: Path) -> str:
    """The weight format of a checkpoint folder: its config's ``quantization.format`` (written
    by ``rt-quantize`` and by ``RTDriver.save``), else its weight file's ``quantization``
    metadata (relational-transformers-utils' ``quantize_checkpoint``), else the config's
    ``weight_format`` (ours: fp32, fp16), else ``fp32`` (the library's own ``save_pretrained``
    records none; a trained model is fp32). ``weight_format`` comes last: ``rt-quantize`` copies
    the source's config, so its folder made from one of ours says ``weight_format: fp32``."""
    for d in (folder, folder / "classification", folder / "regression"):
        if not (d / "config.json").is_file():
            continue
        config = json.loads((d / "config.json").read_text())
        quantization = config.get("quantization")
        if isinstance(quantization, dict) and quantization.get("format"):
            return str(quantization["format"])
        weights = d / str(config.get("checkpoint_file", "model.safetensors"))
        if weights.suffix == ".safetensors" and weights.is_file():
            from safetensors import safe_open

            with safe_open(str(weights), framework="pt") as handle:
                label = (handle.metadata() or {}).get("quantization")
            if label:
                return str(label)
        return str(config.get("weight_format", "fp32"))
    return "fp32"


def write_formats(
    source: Path, spec: Spec, formats: tuple[WeightFormat, ...], target_of: Any
) -> dict[str, SavedCheckpoint]:
    """Each of ``formats`` written from the fp32 checkpoint ``source`` into ``target_of(fmt)``
    (a folder ``RTDriver.from_spec(checkpoint=...)`` loads: weights, head, statistics).
    A source already below fp32 is refused: quantizing it again would compound the error."""
    folder = checkpoint_dir(source, "the checkpoint")
    found = source_format(folder)
    if found != "fp32":
        raise UserError(
            f"model.library {LIBRARY}: checkpoint '{source}' holds {found} weights; quantize the fp32 "
            "checkpoint a train+predict run saved (quantizing a quantized file compounds its error)"
        )
    driver = RTDriver.from_spec(spec, checkpoint=folder, device="cpu")
    return {fmt: driver.save(target_of(fmt), fmt) for fmt in formats}


@dataclass
class EvalSet:
    """The held-out rows' contexts, built once with the checkpoint's statistics."""

    contexts: Contexts
    vectors: Encoded
    rows: np.ndarray  # context indices scored: not training rows, label present
    labels: np.ndarray  # their labels in the harness's convention (regression: target units)


def eval_set(spec: Spec, spec_dir: Path, source: Path, limit: int) -> EvalSet:
    """The first ``limit`` root keys of the spec's data through the harness's retrieve and
    preprocess, as contexts built with the checkpoint's saved statistics."""
    from tasks.libraries.relational_transformers.contexts import Stats
    from tasks.sources.open import open_sources
    from tasks.stages.preprocess import preprocess
    from tasks.stages.retrieve import list_root_keys, retrieve

    stats_file = checkpoint_dir(source, "the checkpoint") / STATS_FILE
    if not stats_file.is_file():
        raise UserError(
            f"model.library {LIBRARY}: checkpoint '{source}' has no {STATS_FILE}; task metrics need the "
            "statistics it was trained with: quantize a checkpoint the harness saved"
        )
    stats = Stats.from_json(stats_file.read_text())
    sources = open_sources(spec, spec_dir)
    keys, _ = list_root_keys(spec, sources)
    table = preprocess(spec, retrieve(spec, sources, keys[:limit])).table
    contexts = build_contexts(table, spec, stats)
    labels = contexts.labels
    rows = np.flatnonzero(~contexts.train & ~np.isnan(labels))
    if rows.size == 0:
        raise UserError(
            f"quantize: the first {limit} root keys hold no held-out row with a label; raise --rows or "
            "task.validation_fraction"
        )
    values = labels[rows]
    if spec.task.kind == "regression":  # contexts hold normalised labels; metrics in target units
        values = values * stats.target_std + stats.target_mean
    return EvalSet(contexts, encode(contexts), rows, values.astype(np.float64))


@dataclass(frozen=True)
class Probe:
    """One format, loaded in a fresh process."""

    weights: str
    load_seconds: float
    rss_before_load: int  # bytes, after the imports
    rss_after_load: int
    peak_rss_during_load: int  # VmHWM reset just before the load
    parameter_dtypes: tuple[str, ...]  # as loaded (the library builds fp32 and copies into it)
    parameter_bytes: int
    scores: np.ndarray | None  # the harness's convention, one per evaluation row


def _child(request: dict[str, Any]) -> None:
    import psutil

    torch.set_num_threads(int(request["threads"]))
    spec = parse_spec(request["spec"], "(quantize)")
    me = psutil.Process()
    rss_before = int(me.memory_info().rss)
    reset_high_water()
    with Clock().measure() as took:
        driver = RTDriver.from_spec(spec, checkpoint=request["folder"], device="cpu")
    load = took.seconds
    figures: dict[str, Any] = {
        "weights": request["weights"],
        "load_seconds": load,
        "rss_before_load": rss_before,
        "rss_after_load": int(me.memory_info().rss),
        "peak_rss_during_load": high_water_bytes(),
        "parameter_dtypes": sorted({str(p.dtype) for p in driver.model.parameters()}),
        "parameter_bytes": sum(p.numel() * p.element_size() for p in driver.model.parameters()),
    }
    if request["eval"]:
        with open(request["eval"], "rb") as f:
            ev: EvalSet = pickle.load(f)  # written by this module's parent, never a user's file
        np.save(request["scores"], _scores(driver, ev))
    Path(request["out"]).write_text(json.dumps(figures))


@torch.no_grad()
def _scores(driver: RTDriver, ev: EvalSet) -> np.ndarray:
    """Scores of the evaluation rows in their order, collated per batch as they are served."""
    out = np.empty((len(ev.rows), *((len(driver.stats.classes),) if driver.kind == "category" else ())))
    for idx in plan_batches(ev.contexts.lengths[ev.rows], EVAL_BATCH, "by_length"):
        scores = driver.scores(collate(ev.contexts, ev.vectors, ev.rows[idx]))
        if driver.kind == "regression":
            scores = scores * driver.stats.target_std + driver.stats.target_mean
        out[idx] = scores.numpy()
    return out


def probe_in_fresh_process(
    folder: Path, weights: str, spec: Spec, eval_file: Path | None, work: Path, threads: int
) -> Probe:
    """Load ``folder`` in a new Python process and read its figures back."""
    out, scores = work / f"{weights}.json", work / f"{weights}.npy"
    request: dict[str, Any] = {
        "folder": str(folder),
        "weights": weights,
        "spec": spec.to_dict(),
        "eval": str(eval_file) if eval_file else None,
        "out": str(out),
        "scores": str(scores),
        "threads": threads,
    }
    req = work / f"{weights}.request.json"
    req.write_text(json.dumps(request))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", __name__, str(req)], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"loading the {weights} checkpoint in a fresh process failed:\n{done.stderr[-3000:]}")
    figures = json.loads(out.read_text())
    figures["parameter_dtypes"] = tuple(figures["parameter_dtypes"])
    return Probe(**figures, scores=np.load(scores) if eval_file else None)


def _metrics(kind: str, scores: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    q = Quality(kind)
    n = len(labels)
    q.add(torch.from_numpy(scores), torch.from_numpy(labels), torch.ones(n, dtype=torch.bool))
    return {
        k: v for k, v in q.metrics().items() if k not in ("rows", "majority_rate", "mae_of_mean", "unseen_class_rows")
    }


def compare(kind: str, probes: dict[str, Probe], labels: np.ndarray | None) -> dict[str, dict[str, float]]:
    """Per format: its task metrics on the evaluation rows, each metric minus fp16's, and the
    largest absolute difference of its output (probabilities; regression values) from fp16's."""
    out: dict[str, dict[str, float]] = {}
    ref = probes.get("fp16")
    if labels is None or ref is None or ref.scores is None:
        return out
    base = _metrics(kind, ref.scores, labels)

    def activate(s: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(s)
        if kind == "binary":
            return torch.sigmoid(t).numpy()
        return torch.softmax(t, -1).numpy() if kind == "category" else s

    for fmt, p in probes.items():
        assert p.scores is not None
        m = _metrics(kind, p.scores, labels)
        row = dict(m)
        row.update({f"{k} vs fp16": v - base[k] for k, v in m.items()})
        row["max abs output diff vs fp16"] = float(np.abs(activate(p.scores) - activate(ref.scores)).max())
        out[fmt] = row
    return out


def probe_record(p: Probe) -> dict[str, Any]:
    d = asdict(p)
    d.pop("scores")
    return d


if __name__ == "__main__":
    _child(json.loads(Path(sys.argv[1]).read_text()))
