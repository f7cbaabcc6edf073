"""Every deployment backend side by side: ``relflow-bench backends-report SPEC``.

Trains once (a ``train+predict`` run), then writes the fp16 / int8 / int4 versions of that
checkpoint and one export bundle (plus ONNX Runtime's dynamic int8 model), outside every
measurement. Each variant is then a full ``relflow-bench run`` in predict mode in a fresh
process (``flows/sweeps/launch.py``, as a sweep configuration), interleaved round by round
with the order rotated (as ``compile-report``), every one against the fp16 checkpoint as
its quality reference:

    pytorch_eager_fp32   the trained checkpoint, eager (packed path where eligible)
    pytorch_eager_fp32_padded  the same with run.packing=off: the padded path the ONNX graph runs
    pytorch_compiled     the same, run.compile.model: true (whole model, dynamic shapes)
    pytorch_bf16         the same under bf16 autocast (run.precision: bf16): oneDNN's bf16
                         kernels on AVX-512-BF16 / AMX hosts; output tolerance 5e-2
    pytorch_fp16|int8|int4  the quantized checkpoints, expanded to fp32 at load
    onnxruntime_fp32     the bundle in ONNX Runtime (padded path), CPUExecutionProvider, as
                         many intra-op threads as torch (tag relflow.onnxruntime.intra_op_threads)
    onnxruntime_int8     ONNX Runtime's dynamic int8 quantization of the bundle
    triton_fp16|fp8|int8 the quantized checkpoints served packed by the Triton backend (fp16
                         compute); CUDA hosts only, skipped and said so elsewhere

One parent MLflow run holds the children (tag ``relflow.variant``) and the table
(``backends_report.json`` / ``.md``) and chart (``backends_report.html``). Medians over
rounds; the order-statistic 95% interval of the steady median only from 6 rounds (fewer
rounds support none, and the table says so). The table and chart are pure functions of the
samples, in ``dashboards/backends.py`` (the dashboard draws the same chart from MLflow).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from dashboards.backends import ROUND_TAG, SLOWER_TAG, backends_figure, slower_than_eager, summarize, to_markdown
from tasks.measure import keys as K
from tasks.measure.report import RunSummary, Sample

ORT = "run.backend=onnxruntime"
VARIANTS: dict[str, Callable[[dict[str, str]], list[str]]] = {
    "pytorch_eager_fp32": lambda f: [f"run.checkpoint={f['fp32']}"],
    # the ONNX graph is the padded path: PyTorch padded too separates the backend's effect
    # from the packing algorithm's
    "pytorch_eager_fp32_padded": lambda f: [f"run.checkpoint={f['fp32']}", "run.packing=off"],
    "pytorch_compiled": lambda f: [f"run.checkpoint={f['fp32']}", "run.compile.model=true"],
    # bf16 autocast over the fp32 weights: oneDNN's bf16 GEMMs on hosts with AVX-512-BF16/AMX
    "pytorch_bf16": lambda f: [f"run.checkpoint={f['fp32']}", "run.precision=bf16"],
    "pytorch_fp16": lambda f: [f"run.checkpoint={f['fp16']}"],
    "pytorch_int8": lambda f: [f"run.checkpoint={f['int8']}"],
    "pytorch_int4": lambda f: [f"run.checkpoint={f['int4']}"],
    "onnxruntime_fp32": lambda f: [ORT, f"run.onnxruntime.model={f['bundle']}"],
    "onnxruntime_int8": lambda f: [
        ORT,
        f"run.onnxruntime.model={f['bundle']}",
        "run.onnxruntime.quantization=dynamic_int8",
    ],
}
# Triton serving (tasks/backends/triton): the checkpoints' weights stay packed on the device.
TRITON = ["run.backend=triton", "run.precision=fp16"]
VARIANTS.update(
    {f"triton_{fmt}": (lambda f, fmt=fmt: [*TRITON, f"run.checkpoint={f[fmt]}"]) for fmt in ("fp16", "fp8", "int8")}
)


def runnable_here(variants: list[str], say: Callable[[str], None]) -> list[str]:
    """The variants this host can run: the Triton ones need CUDA (said, not silently dropped)."""
    import torch

    if torch.cuda.is_available():
        return variants
    skipped = [v for v in variants if v.startswith("triton_")]
    if skipped:
        say(f"  skipped {skipped}: the Triton backend needs a CUDA device, and this host has none")
    return [v for v in variants if v not in skipped]


@dataclass
class Launch:
    """Where and how the variants' processes run (the report's store and spec folder)."""

    spec_path: Path
    overrides: list[str]
    parent: str
    workdir: Path
    tracking_uri: str


def _run(launch: Launch, extra: list[str], name: str, tags: dict[str, str]) -> RunSummary:
    """One ``relflow-bench run`` in a fresh process; its report, or RuntimeError with the
    child's closing paragraph."""
    from flows.sweeps.launch import launch_local
    from tasks.spec import load_spec

    spec = load_spec(launch.spec_path, [*launch.overrides, *extra])
    done = launch_local(
        spec.to_dict(),
        name=name,
        spec_dir=str(launch.spec_path.parent),
        parent_run_id=launch.parent,
        tags=tags,
        workdir=launch.workdir,
        tracking_uri=launch.tracking_uri,
        api_url=None,  # each child starts Prefect's temporary server, as a standalone run does
    )
    if done.summary is None:
        raise RuntimeError(f"{name} failed with exit {done.returncode}: {done.error}")
    return done.summary


def prepare_files(launch: Launch, say: Callable[[str], None]) -> dict[str, str]:
    """Train once; quantize and export that checkpoint (nothing here is measured)."""
    from model.checkpoint import quantize_checkpoint
    from tasks.backends.bundle import export_bundle
    from tasks.backends.onnxruntime import dynamic_int8
    from tasks.measure.clock import Clock
    from tasks.run.backend_setup import needed_outputs
    from tasks.spec import load_spec

    train = _run(launch, ["run.mode=train+predict"], "train", {"relflow.variant": "train"})
    if train.checkpoint_path is None:
        raise RuntimeError(f"the training run {train.run_id} wrote no checkpoint")
    ckpt = Path(train.checkpoint_path)
    say(f"  trained once: {ckpt} (run {train.run_id})")
    files = {"fp32": str(ckpt)}
    for fmt in ("fp16", "int8", "int4", "fp8"):
        target = launch.workdir / f"{ckpt.stem}.{fmt}.ckpt"
        quantize_checkpoint(ckpt, target, fmt)
        files[fmt] = str(target)
    spec = load_spec(launch.spec_path, [*launch.overrides, "run.mode=predict", f"run.checkpoint={ckpt}"])
    bundle = export_bundle(ckpt, spec, needed_outputs(spec), launch.workdir / "bundles")
    dynamic_int8(bundle, Clock())
    files["bundle"] = str(bundle.path)
    say(f"  quantized (fp16, int8, int4, fp8) and exported: {bundle.path}")
    return files


def collect(
    launch: Launch, repeats: int, variants: list[str], files: dict[str, str], say: Callable[[str], None]
) -> list[Sample]:
    from tasks.tracking.reader import get_stored_run

    samples = []
    variants = runnable_here(variants, say)
    base = ["run.mode=predict", f"run.reference_checkpoint={files['fp16']}"]
    for r in range(repeats):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for v in order:
            try:
                tags = {"relflow.variant": v, ROUND_TAG: str(r)}
                done = _run(launch, [*base, *VARIANTS[v](files)], f"{v}-{r}", tags)
            except RuntimeError as err:  # one broken variant is a row of the table, not the end
                say(f"  round {r + 1} {v:<20} FAILED: {str(err)[-400:]}")
                samples.append(Sample(v, r, None))
                continue
            # the summary has no tags; the backend's tags are on the child's MLflow run
            report = replace(done, tags=get_stored_run(done.run_id, launch.tracking_uri).tags)
            samples.append(Sample(v, r, report))
            m = report.metrics
            say(
                f"  round {r + 1} {v:<20} steady {m[K.STEADY_ROWS_PER_S]:>10,.0f} rows/s, "
                f"e2e {m.get(K.E2E_PREDICT_ROWS_PER_S, math.nan):>9,.0f} rows/s, "
                f"first call {m[K.FIRST_CALL_SECONDS]:.2f} s ({report.validity}, run {report.run_id[:8]})"
            )
    return samples


def run_report(
    spec_path: Path, overrides: list[str], repeats: int, variants: list[str], say: Callable[[str], None]
) -> str:
    from tasks.runtime.errors import UserError
    from tasks.spec import load_spec
    from tasks.tracking.writer import Tracker

    if repeats < 1:
        raise UserError("--repeats must be at least 1.")
    s = load_spec(spec_path, overrides)
    headline = K.HEADLINE_QUALITY[s.task.kind]
    tracker = Tracker(s.name)
    parent = tracker.start(
        f"{s.name}-backends-report", {"relflow.spec_hash": s.spec_hash, "relflow.report": "backends"}
    )
    say(f"parent MLflow run {parent} in experiment '{s.name}'")
    try:
        workdir = Path(s.run.output_dir).resolve() / f"backends-{parent[:12]}"
        workdir.mkdir(parents=True, exist_ok=True)
        launch = Launch(spec_path, overrides, parent, workdir, tracker.uri)
        files = prepare_files(launch, say)
        samples = collect(launch, repeats, variants, files, say)
        rows = summarize(samples, headline)
        md = to_markdown(rows, headline)
        if slower := slower_than_eager(rows):
            tracker.set_tags({SLOWER_TAG: "; ".join(slower)})
        tracker.log_dict({"rows": rows, "files": files}, "backends_report.json")
        tracker.log_text(md, "backends_report.md")
        tracker.log_text(
            backends_figure(rows, headline).to_html(include_plotlyjs=True, full_html=True), "backends_report.html"
        )
        tracker.finish()
    except BaseException as err:
        tracker.fail(err)
        raise
    return md
