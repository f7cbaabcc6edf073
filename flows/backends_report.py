"""Every deployment backend side by side: ``relflow-bench backends-report SPEC``.

Trains once (a ``train+predict`` run), then writes the fp16 / int8 / int4 versions of that
checkpoint and one export bundle (plus ONNX Runtime's dynamic int8 model), outside every
measurement. Each variant is then a full ``relflow-bench run`` in predict mode in a fresh
process, interleaved round by round with the order rotated (as ``compile-report``), every
one against the fp16 checkpoint as its quality reference:

    pytorch_eager_fp32   the trained checkpoint, eager (packed path where eligible)
    pytorch_compiled     the same, run.compile.model: true (whole model, dynamic shapes)
    pytorch_fp16|int8|int4  the quantized checkpoints, expanded to fp32 at load
    onnxruntime_fp32     the bundle in ONNX Runtime (padded path), CPUExecutionProvider
    onnxruntime_int8     ONNX Runtime's dynamic int8 quantization of the bundle

One parent MLflow run holds the children (tag ``relflow.variant``) and the table
(``backends_report.json`` / ``.md``) and chart (``backends_report.html``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.stats import median_ci

ORT = "run.backend=onnxruntime"
VARIANTS: dict[str, Callable[[dict[str, str]], list[str]]] = {
    "pytorch_eager_fp32": lambda f: [f"run.checkpoint={f['fp32']}"],
    "pytorch_compiled": lambda f: [f"run.checkpoint={f['fp32']}", "run.compile.model=true"],
    "pytorch_fp16": lambda f: [f"run.checkpoint={f['fp16']}"],
    "pytorch_int8": lambda f: [f"run.checkpoint={f['int8']}"],
    "pytorch_int4": lambda f: [f"run.checkpoint={f['int4']}"],
    "onnxruntime_fp32": lambda f: [ORT, f"run.onnxruntime.model={f['bundle']}"],
    "onnxruntime_int8": lambda f: [ORT, f"run.onnxruntime.model={f['bundle']}",
                                   "run.onnxruntime.quantization=dynamic_int8"],
}
HEADLINE = {"category": "accuracy", "binary": "auc", "regression": "mae"}


@dataclass
class Sample:
    variant: str
    round: int
    metrics: dict[str, float]
    tags: dict[str, str]
    run_id: str
    validity: str


def _cli(spec: Path, overrides: list[str], json_out: Path, parent: str, tags: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "flows.cli", "run", str(spec), "--json", str(json_out), "--parent-run", parent]
    for k, v in tags.items():
        cmd += ["--tag", f"{k}={v}"]
    for o in overrides:
        cmd += ["--set", o]
    proc = subprocess.run(cmd, env=dict(os.environ), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[3:6])} {tags} failed with exit {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(json_out.read_text())


def prepare_files(spec_path: Path, overrides: list[str], parent: str, workdir: Path,
                  say: Callable[[str], None]) -> dict[str, str]:
    """Train once; quantize and export that checkpoint (nothing here is measured)."""
    from model.checkpoint import quantize_checkpoint
    from tasks.backends.bundle import export_bundle, read_bundle
    from tasks.backends.onnxruntime import dynamic_int8
    from tasks.backends.setup import needed_outputs
    from tasks.clock import Clock
    from tasks.spec import load_spec

    train = _cli(spec_path, [*overrides, "run.mode=train+predict"], workdir / "train.json", parent,
                 {"relflow.variant": "train"})
    ckpt = Path(train["checkpoint_path"])
    say(f"  trained once: {ckpt} (run {train['run_id']})")
    files = {"fp32": str(ckpt)}
    for fmt in ("fp16", "int8", "int4"):
        target = workdir / f"{ckpt.stem}.{fmt}.ckpt"
        quantize_checkpoint(ckpt, target, fmt)
        files[fmt] = str(target)
    spec = load_spec(spec_path, [*overrides, "run.mode=predict", f"run.checkpoint={ckpt}"])
    bundle = export_bundle(ckpt, spec, needed_outputs(spec), workdir / "bundles")
    dynamic_int8(read_bundle(bundle.path), Clock())
    files["bundle"] = str(bundle.path)
    say(f"  quantized (fp16, int8, int4) and exported: {bundle.path}")
    return files


def collect(spec_path: Path, overrides: list[str], repeats: int, variants: list[str], files: dict[str, str],
            parent: str, workdir: Path, say: Callable[[str], None]) -> list[Sample]:
    samples = []
    base = [*overrides, "run.mode=predict", f"run.reference_checkpoint={files['fp16']}"]
    for r in range(repeats):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for v in order:
            try:
                summary = _cli(spec_path, [*base, *VARIANTS[v](files)], workdir / f"{v}-{r}.json", parent,
                               {"relflow.variant": v})
            except RuntimeError as err:  # one broken variant is a row of the table, not the end
                say(f"  round {r + 1} {v:<20} FAILED: {str(err)[-400:]}")
                samples.append(Sample(v, r, {}, {}, "", "FAILED"))
                continue
            from tasks.tracking import get_run_record

            rec = get_run_record(summary["run_id"])
            s = Sample(v, r, summary["metrics"], rec.tags, summary["run_id"], summary["validity"])
            samples.append(s)
            m = s.metrics
            say(f"  round {r + 1} {v:<20} steady {m['compute.steady_rows_per_s']:>10,.0f} rows/s, "
                f"e2e {_e2e(m):>9,.0f} rows/s, first call {m['compute.first_call_seconds']:.2f} s "
                f"({s.validity}, run {s.run_id[:8]})")
    return samples


def _e2e(m: dict[str, float]) -> float:
    return m.get("e2e.predict.rows_per_s", m.get("e2e.rows_per_s", float("nan")))


def summarize(samples: list[Sample], headline: str) -> list[dict[str, Any]]:
    rows = []
    for v in dict.fromkeys(s.variant for s in samples):
        mine = [s for s in samples if s.variant == v]

        def med(key: str, default: float = float("nan"), mine=mine) -> float:
            return median_ci([s.metrics.get(key, default) for s in mine])[0]

        steady, lo, hi = median_ci([s.metrics.get("compute.steady_rows_per_s", float("nan")) for s in mine])
        ort = v.startswith("onnxruntime")
        rows.append({
            "variant": v,
            "rounds": len(mine),
            "first_call_s": med("compute.first_call_seconds"),
            "steady_rows_per_s": steady, "steady_ci_low": lo, "steady_ci_high": hi,
            "e2e_predict_rows_per_s": median_ci([_e2e(s.metrics) for s in mine])[0],
            "batch_p99_ms": med("compute.batch_ms.p99"),
            "quality": med(f"quality.{headline}"),
            "delta_vs_reference": med("quality.delta_vs_reference"),
            "file_bytes": med("backend.model_bytes") if ort else med("checkpoint.bytes"),
            "load_s": med("backend.load_seconds") if ort else med("checkpoint.load_seconds"),
            "peak_rss_mib": max(s.metrics.get("memory.host_peak_bytes", 0.0) for s in mine) / 2**20,
            "graph_breaks": med("compute.graph_breaks_warmup", 0.0),
            "recompiles": med("compute.recompiles", 0.0),
            "validity": ",".join(sorted({s.validity for s in mine})),
            "run_ids": [s.run_id for s in mine],
        })
    return rows


def to_markdown(rows: list[dict[str, Any]], headline: str) -> str:
    head = (f"| variant | first call s | steady rows/s [95% CI] | e2e predict rows/s | batch p99 ms | "
            f"{headline} | delta vs fp16 ref | file bytes | load s | peak RSS MiB | graph breaks | validity |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['first_call_s']:.2f} | {r['steady_rows_per_s']:,.0f} "
            f"[{r['steady_ci_low']:,.0f}, {r['steady_ci_high']:,.0f}] | {r['e2e_predict_rows_per_s']:,.0f} | "
            f"{r['batch_p99_ms']:.1f} | {r['quality']:.4f} | {r['delta_vs_reference']:+.4f} | "
            f"{r['file_bytes']:,.0f} | {r['load_s']:.3f} | {r['peak_rss_mib']:,.0f} | {r['graph_breaks']:.0f} | "
            f"{r['validity']} |")
    return "\n".join(lines)


def run_report(spec_path: Path, overrides: list[str], repeats: int, variants: list[str],
               say: Callable[[str], None]) -> str:
    from dashboards.backends import backends_figure
    from tasks.errors import UserError
    from tasks.spec import load_spec
    from tasks.tracking import Tracker

    if repeats < 1:
        raise UserError("--repeats must be at least 1.")
    s = load_spec(spec_path, overrides)
    headline = HEADLINE[s.task.kind]
    tracker = Tracker(s.name)
    parent = tracker.start(f"{s.name}-backends-report", {"relflow.spec_hash": s.spec_hash,
                                                         "relflow.report": "backends"})
    say(f"parent MLflow run {parent} in experiment '{s.name}'")
    try:
        workdir = Path(s.run.output_dir).resolve() / f"backends-{parent[:12]}"
        workdir.mkdir(parents=True, exist_ok=True)
        files = prepare_files(spec_path, overrides, parent, workdir, say)
        samples = collect(spec_path, overrides, repeats, variants, files, parent, workdir, say)
        rows = summarize(samples, headline)
        md = to_markdown(rows, headline)
        tracker.log_dict({"rows": rows, "files": files}, "backends_report.json")
        tracker.log_text(md, "backends_report.md")
        tracker.log_text(backends_figure(rows, headline).to_html(include_plotlyjs=True, full_html=True),
                         "backends_report.html")
        tracker.finish()
    except BaseException as err:
        tracker.fail(err)
        raise
    return md
