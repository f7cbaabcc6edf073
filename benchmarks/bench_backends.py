"""Predict-step time of each backend on the same batches, side by side in one process.

What: the model step alone (no retrieve/preprocess/write, no Prefect, no MLflow) for
PyTorch eager packed, PyTorch eager padded, ONNX Runtime fp32 (the exported padded graph)
and ONNX Runtime dynamic int8, on the default workload's first ``--roots`` orders, with
untrained weights (speed only). Rounds interleave the variants so host drift hits all
alike; the figure is the median seconds per batch over rounds and batches, reported as a
ratio to eager packed. ``relflow-bench backends-report`` is the end-to-end version.

    python benchmarks/bench_backends.py [--roots 2048] [--rounds 3] [--spec SPEC]

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from model import ModelConfig, RelationalTransformer
from model.export import ExportForward, export_onnx, output_name
from tasks.measure.clock import Clock
from tasks.spec import load_spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batches import prepared  # noqa: E402  (the harness's chain, untimed)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default=str(Path(__file__).parent / "tpch_orders.yaml"))
    ap.add_argument("--roots", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    spec, schema, _, tz = prepared(load_spec(args.spec), Path(args.spec).resolve().parent, args.roots)
    batch = tz.batch
    torch.manual_seed(0)
    m = spec.model
    model = RelationalTransformer(schema, ModelConfig(m.d_model, m.layers, m.heads, m.dropout)).eval()
    outputs = ("prediction",)
    clock = Clock()
    tmp = Path(tempfile.mkdtemp(prefix="bench-backends-"))
    with clock.measure() as export:
        sig = export_onnx(model, outputs, tmp / "model.onnx")
    quantize_dynamic(str(tmp / "model.onnx"), str(tmp / "int8.onnx"), weight_type=QuantType.QInt8)
    sessions = {
        name: ort.InferenceSession(str(tmp / f), providers=["CPUExecutionProvider"])
        for name, f in (("onnxruntime_fp32", "model.onnx"), ("onnxruntime_int8", "int8.onnx"))
    }
    wrapper = ExportForward(model, outputs)
    parts = [batch.select(idx) for idx in torch.arange(batch.size).split(spec.run.batch_size)]

    def torch_step(packing: str):
        def step(part):
            model.packing = packing
            with torch.no_grad():
                return model(part, outputs=outputs)["prediction"].numpy()

        return step

    def ort_step(session):
        wanted = {i.name for i in session.get_inputs()}  # the exporter may drop unused inputs

        def step(part):
            flat = zip(sig.inputs, wrapper.flat_inputs(part), strict=True)
            feeds = {k: v.numpy() for k, v in flat if k in wanted}
            return session.run([output_name(o) for o in outputs], feeds)[0]

        return step

    variants = {
        "pytorch_eager_packed": torch_step("auto"),
        "pytorch_eager_padded": torch_step("off"),
        **{k: ort_step(s) for k, s in sessions.items()},
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    reference: dict[str, object] = {}  # each variant's first output, for the agreement column
    for r in range(args.rounds + 1):  # round 0 is warm-up
        names = list(variants)
        names = names[r % len(names) :] + names[: r % len(names)]
        for name in names:
            for part in parts:
                with clock.measure() as span:
                    out = variants[name](part)
                if r:
                    times[name].append(span.seconds)
                elif name not in reference:
                    reference[name] = out
    base_s = statistics.median(times["pytorch_eager_packed"])
    rows = []
    print(
        f"{len(parts)} batches of <= {spec.run.batch_size} roots, {args.rounds} rounds; export {export.seconds:.1f} s"
    )
    print(f"{'variant':<24} {'ms/batch (median)':>18} {'vs eager packed':>16} {'max |diff| vs packed':>22}")
    for name, ts in times.items():
        med = statistics.median(ts)
        diff = float(abs(torch.as_tensor(reference[name]) - torch.as_tensor(reference["pytorch_eager_packed"])).max())
        rows.append(
            {"variant": name, "ms_per_batch": med * 1e3, "ratio_vs_eager_packed": med / base_s, "max_abs_diff": diff}
        )
        print(f"{name:<24} {med * 1e3:>18.2f} {med / base_s:>15.2f}x {diff:>22.2e}")
    print(
        json.dumps(
            {
                "roots": int(batch.size),
                "rounds": args.rounds,
                "export_seconds": export.seconds,
                "torch_threads": torch.get_num_threads(),
                "rows": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
