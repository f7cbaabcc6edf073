"""CUDA paths, checked on a real GPU: one short script for a lent GPU host.

What: the harness's CUDA-only paths, each a pass/fail line with its figure:
- the synchronising clock (a queued matmul burst timed with and without sync),
- the compute stage's Engine on CUDA: train + predict in fp32, bf16 (autocast) and fp16
  (autocast + GradScaler), with pinned host batches and non-blocking copies, fused AdamW;
  predictions on CUDA vs CPU (fp32) agree,
- packed vs padded encoders on CUDA agree and their speed ratio,
- region compile on CUDA: first call vs steady,
- the peak matmul rate (MFU denominator) in fp32 and bf16.
Why: CI and the development host have no GPU; these branches are otherwise never run.
How: the default workload's real batches (stage functions, scale 0.01), no Prefect/MLflow.

    python benchmarks/check_cuda.py [--out results.json]

Prints one line per check, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))


def check_clock(results: dict) -> None:
    from tasks.measure.clock import Clock, wall_clock

    dev = torch.device("cuda")
    a = torch.randn(8192, 8192, device=dev)
    torch.cuda.synchronize()
    t0 = wall_clock()
    for _ in range(20):
        a @ a
    unsynced = wall_clock() - t0
    torch.cuda.synchronize()
    with Clock(dev).measure() as span:
        for _ in range(20):
            a @ a
    results["clock"] = {
        "unsynchronised_ms": unsynced * 1e3,
        "synchronised_ms": span.seconds * 1e3,
        "ok": span.seconds > 2 * unsynced,
    }


def engine_run(spec, schema, enc, tz, device, precision: str, weights: dict | None = None) -> dict:
    """Train then predict; with ``weights``, no training: predict with exactly those weights."""
    from tasks.libraries.reference.engine import Engine
    from tasks.measure.clock import Clock

    s = spec.model_copy(
        update={
            "run": spec.run.model_copy(
                update={
                    "precision": precision,
                    "device": str(device),
                    "loader": spec.run.loader.model_copy(update={"pin_memory": device.type == "cuda"}),
                }
            )
        }
    )
    eng = Engine(s, schema, device, clock=Clock(device), encoding=enc)
    if weights is None:
        eng.train(tz)
    else:
        eng.model.load_state_dict(weights)
    out = eng.predict(tz, ("prediction",))
    opt = eng.optimizer
    fused = bool(opt.param_groups[0].get("fused")) if opt is not None else None
    pt, tt = eng.predict_timings, eng.train_timings
    return {
        "train_steady_rows_per_s": tt.steady_rows_per_s,
        "predict_steady_rows_per_s": pt.steady_rows_per_s,
        "train_first_call_s": tt.first_call_seconds,
        "predict_first_call_s": pt.first_call_seconds,
        "fused_adamw": fused,
        "scaler": getattr(eng, "scaler", None) is not None,
        "quality": eng.quality.metrics() if hasattr(eng, "quality") else {},
        "prediction": out.tensors["prediction"],
        "finite": bool(torch.isfinite(out.tensors["prediction"]).all()),
        "weights": {k: v.detach().cpu().clone() for k, v in eng.model.state_dict().items()},
    }


def check_engine(results: dict) -> None:
    from batches import load_chunk

    spec, schema, enc, tz = load_chunk(ROOT / "tpch_orders.yaml", ["run.epochs=1", "run.device=cuda"])
    cuda = torch.device("cuda")
    rows = {}
    for precision in ("fp32", "bf16", "fp16"):
        r = engine_run(spec, schema, enc, tz, cuda, precision)
        rows[precision] = r
    cpu = engine_run(spec, schema, enc, tz, torch.device("cpu"), "fp32")
    # Same weights on both devices: training on each diverges by float accumulation order
    # (0.022 max abs probability difference after one epoch was seen), which is not a bug.
    same = engine_run(spec, schema, enc, tz, torch.device("cpu"), "fp32", weights=rows["fp32"]["weights"])
    diff = float((rows["fp32"]["prediction"] - same["prediction"]).abs().max())
    trained_apart = float((rows["fp32"]["prediction"] - cpu["prediction"]).abs().max())
    for r in (*rows.values(), cpu, same):
        r.pop("prediction")
        r.pop("weights")
    results["engine"] = {
        "cuda": rows,
        "cpu_fp32": cpu,
        "cuda_vs_cpu_fp32_max_abs_diff": diff,
        "trained_apart_max_abs_diff": trained_apart,
        "ok": diff < 1e-3
        and all(r["finite"] for r in rows.values())
        and rows["fp16"]["scaler"]
        and rows["fp32"]["fused_adamw"],
    }


def check_packing(results: dict) -> None:
    from batches import build_model, load

    from tasks.measure.clock import Clock

    spec, schema, parts = load(ROOT / "tpch_customer.yaml", ["run.batch_size=256"])
    dev = torch.device("cuda")
    model = build_model(spec, schema).to(dev)
    clock = Clock(dev)
    parts = [p.to(dev) for p in parts[:12]]
    times: dict[str, list[float]] = {"auto": [], "off": []}
    diffs = []
    with torch.no_grad():
        for i, p in enumerate(parts):
            outs = {}
            for mode in ("auto", "off") if i % 2 == 0 else ("off", "auto"):
                model.packing = mode
                with clock.measure() as span:
                    outs[mode] = model(p, outputs=("prediction",))["prediction"]
                if i >= 2:
                    times[mode].append(span.seconds)
            diffs.append(float((outs["auto"] - outs["off"]).abs().max()))
    packed, padded = statistics.median(times["auto"]), statistics.median(times["off"])
    results["packing"] = {
        "packed_ms": packed * 1e3,
        "padded_ms": padded * 1e3,
        "speedup": padded / packed,
        "max_abs_diff": max(diffs),
        "ok": max(diffs) < 1e-3,
    }


def check_compile(results: dict) -> None:
    from batches import build_model, load

    from tasks.measure.clock import Clock

    spec, schema, parts = load(ROOT / "tpch_orders.yaml", [])
    dev = torch.device("cuda")
    model = build_model(spec, schema).to(dev)
    model.packing = "off"
    model.compile(encoders=True, pools=True)
    clock = Clock(dev)
    ts = []
    with torch.no_grad():
        for p in parts[:12]:
            with clock.measure() as span:
                model(p.to(dev), outputs=("prediction",))
            ts.append(span.seconds)
    results["compile"] = {
        "first_call_s": ts[0],
        "steady_ms_p50": statistics.median(ts[3:]) * 1e3,
        "ok": ts[0] > statistics.median(ts[3:]),
    }


def check_peak(results: dict) -> None:
    from tasks.run.peak_flops import measure

    dev = torch.device("cuda")
    results["peak"] = {d: measure(dev, d).flops_per_s / 1e12 for d in ("fp32", "bf16")}
    results["peak"]["unit"] = "TFLOP/s"
    results["peak"]["ok"] = results["peak"]["bf16"] > 100


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--only", nargs="*", default=None, help="run only these checks")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this script checks the CUDA paths on a GPU host")
    results: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    for name, fn in (
        ("clock", check_clock),
        ("engine", check_engine),
        ("packing", check_packing),
        ("compile", check_compile),
        ("peak", check_peak),
    ):
        if args.only and name not in args.only:
            continue
        try:
            fn(results)
        except Exception as err:  # noqa: BLE001 - report every check, keep going
            results[name] = {
                "ok": False,
                "error": f"{type(err).__name__}: {err}",
                "traceback": traceback.format_exc()[-2000:],
            }
        r = results[name]
        print(
            f"{name:<8} {'PASS' if r.get('ok') else 'FAIL'}  "
            + json.dumps({k: v for k, v in r.items() if k not in ("traceback",)}, default=str)[:600],
            flush=True,
        )
    line = json.dumps(results, default=str)
    if args.out:
        args.out.write_text(line)
    print(line)


if __name__ == "__main__":
    main()
