"""The Triton backend against PyTorch and ONNX Runtime on a CUDA host: predict-step speed.

What: the model step alone (no retrieve/preprocess/write, no Prefect, no MLflow) on the
default workload's batches at several batch sizes, for PyTorch eager packed, PyTorch
compiled (whole model, ``torch.compile(dynamic=True)``), ONNX Runtime's CUDA provider (the
exported padded graph) and the Triton backend with fp32, fp16, fp8 and int8 weights
(fp16/fp8/int8 compute in fp16). Untrained weights (speed, and agreement with eager).
Next to every figure: max |difference| of the predictions vs PyTorch eager packed fp32 on the
same batches, and for Triton the device bytes it serves from (``backend.model_bytes``).
Why: issue 23's goals on the GPU: Triton steady rows/s >= 1.5x the best PyTorch variant at
the default batch size, fp8 bytes <= 0.55x fp16. Variants interleave round by round; the
figure is the median ms per batch over rounds and batches (CUDA synchronised), rows/s is
rows / total steady seconds.

    python benchmarks/bench_triton.py [--spec SPEC] [--batch-sizes 64,256,1024] [--rounds 5]

Needs CUDA (exits 2 saying so elsewhere). Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default=str(ROOT / "tpch_orders.yaml"))
    ap.add_argument("--batch-sizes", default="64,256,1024")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--roots", type=int, default=8192, help="root rows of the workload used")
    args = ap.parse_args()
    # imported before the CUDA check, so a CPU host still checks that the script's parts resolve
    from batches import build_model, load_chunk

    from model.export import ExportForward, export_onnx, output_name
    from model.quantize import quantize_state
    from tasks.backends.pytorch import whole_model
    from tasks.backends.triton.backend import TritonBackend
    from tasks.measure.clock import Clock

    if not torch.cuda.is_available():
        print("bench_triton.py needs a CUDA device (torch.cuda.is_available() is False); run it on a GPU host.")
        print(json.dumps({"skipped": "needs CUDA", "torch": torch.__version__}))
        return 2

    dev = torch.device("cuda")
    spec, schema, _, tz = load_chunk(Path(args.spec))
    full = tz.batch
    full = full.select(torch.arange(min(args.roots, full.size)))
    model = build_model(spec, schema).to(dev)
    outputs = ("prediction",)
    state = {k: v.cpu() for k, v in model.state_dict().items()}
    triton = {"triton_fp32": TritonBackend(model, dev, "fp32", None, "fp32")}
    for fmt in ("fp16", "fp8", "int8"):
        triton[f"triton_{fmt}"] = TritonBackend(model, dev, fmt, quantize_state(state, fmt, "bench"), "fp16")
    compiled = whole_model(model, "inductor")
    tmp = Path(tempfile.mkdtemp(prefix="bench-triton-"))
    cpu_model = build_model(spec, schema)
    cpu_model.load_state_dict(state)
    sig = export_onnx(cpu_model, outputs, tmp / "model.onnx")
    wrapper = ExportForward(cpu_model, outputs)
    ort_session = None
    try:
        import onnxruntime as ort

        if "CUDAExecutionProvider" in ort.get_available_providers():
            ort_session = ort.InferenceSession(str(tmp / "model.onnx"), providers=["CUDAExecutionProvider"])
    except ImportError:
        pass

    def eager(part):
        with torch.no_grad():
            return model(part, outputs=outputs)["prediction"]

    def comp(part):
        with torch.no_grad():
            return compiled(part, outputs=outputs)["prediction"]

    def ort_step(part):
        assert ort_session is not None
        wanted = {i.name for i in ort_session.get_inputs()}
        flat = zip(sig.inputs, wrapper.flat_inputs(part.to("cpu")), strict=True)
        feeds = {k: v.numpy() for k, v in flat if k in wanted}
        return torch.from_numpy(ort_session.run([output_name(o) for o in outputs], feeds)[0])

    variants = {"pytorch_eager_packed": eager, "pytorch_compiled": comp}
    if ort_session is not None:
        variants["onnxruntime_cuda"] = ort_step
    for name, backend in triton.items():
        variants[name] = lambda part, b=backend: b.step(part, outputs)["prediction"]

    clock = Clock(dev)
    rows_out = []
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, {full.size} roots, {args.rounds} rounds")
    if ort_session is None:
        print("onnxruntime_cuda: skipped (this onnxruntime build has no CUDAExecutionProvider)")
    head = (
        f"{'batch':>6} {'variant':<22} {'ms/batch':>9} {'rows/s':>11} {'vs best torch':>13} "
        f"{'max|diff|':>10} {'bytes':>10}"
    )
    for bs in [int(b) for b in args.batch_sizes.split(",")]:
        parts = [full.select(i).to(dev) for i in torch.arange(full.size).split(bs)]
        times: dict[str, list[float]] = {k: [] for k in variants}
        diffs: dict[str, float] = {}
        for r in range(args.rounds + 1):  # round 0: warm-up (compile, autotune) and the output check
            names = list(variants)
            names = names[r % len(names) :] + names[: r % len(names)]
            for name in names:
                for part in parts:
                    with clock.measure() as span:
                        out = variants[name](part)
                    if r:
                        times[name].append(span.seconds)
                    else:
                        ref = eager(part).float().cpu()
                        d = float((out.float().cpu() - ref).abs().max())
                        diffs[name] = max(diffs.get(name, 0.0), d)
        rows_per_s = {k: full.size / (sum(v) / args.rounds) for k, v in times.items()}
        best_torch = max(rows_per_s["pytorch_eager_packed"], rows_per_s["pytorch_compiled"])
        print(head)
        for name, ts in times.items():
            nbytes = triton[name].model_bytes if name in triton else None
            row = {
                "batch_size": bs,
                "variant": name,
                "ms_per_batch": statistics.median(ts) * 1e3,
                "rows_per_s": rows_per_s[name],
                "ratio_vs_best_pytorch": rows_per_s[name] / best_torch,
                "max_abs_diff_vs_eager": diffs[name],
                "model_bytes": nbytes,
            }
            rows_out.append(row)
            print(
                f"{bs:>6} {name:<22} {row['ms_per_batch']:>9.2f} {row['rows_per_s']:>11,.0f} "
                f"{row['ratio_vs_best_pytorch']:>12.2f}x {row['max_abs_diff_vs_eager']:>10.2e} "
                f"{'' if nbytes is None else f'{nbytes:,}':>10}"
            )
    fp8_vs_fp16 = triton["triton_fp8"].model_bytes / triton["triton_fp16"].model_bytes
    print(f"fp8 / fp16 served bytes: {fp8_vs_fp16:.3f} (goal <= 0.55)")
    print(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(dev),
                "roots": int(full.size),
                "rounds": args.rounds,
                "default_batch_size": spec.run.batch_size,
                "fp8_vs_fp16_bytes": fp8_vs_fp16,
                "rows": rows_out,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
