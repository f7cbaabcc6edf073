"""How far a served prediction may sit from the offline pass over the same key (the output
check, ``run.request.check_outputs``): the one table of tolerances, by serving numerics.

Both sides run the same engine, backend, weights and calibration temperature; only the
batch a row shares with others differs (one request, a server batch, an offline chunk), so
the tolerance is what a different batch composition may move a value by: a different kernel
blocking or reduction order, and for dynamic int8 an activation scale computed per batch.
A cell matches when |served - offline| <= tolerance x max(1, |offline|), on the values the
write step gets (calibrated logits; a regression target in standardised units): absolute
within one unit of zero, relative above it, as float error grows with a value's size (a
small model's calibrated logits reached 32-483 per row in tests/flows/test_benchmark_backends.py,
where ONNX Runtime's fp32 sat up to 1.2e-4 from eager, at most 4e-6 of the row's largest
value, against an absolute 1e-4). The table's values are read at a value near 1:

- ``fp32`` (PyTorch): 1e-5, about 80 float32 ulps;
- ``bf16``: 5e-2, about six bf16 ulps (7.8e-3 relative);
- ``fp16``: 5e-3, about five fp16 ulps (9.8e-4 relative);
- ``int8`` (ONNX Runtime dynamic int8): 5e-2, the activation scale of each batch is its own;
- ``onnxruntime`` (fp32 export): 1e-4, ONNX Runtime picks kernels by batch shape;
- ``triton`` (this project's kernels, fp32): 1e-4, a packed batch's block layout differs.
"""

from __future__ import annotations

from tasks.spec.run import RunSettings

OUTPUT_TOLERANCE: dict[str, float] = {
    "fp32": 1e-5,
    "bf16": 5e-2,
    "fp16": 5e-3,
    "int8": 5e-2,
    "onnxruntime": 1e-4,
    "triton": 1e-4,
}


def output_tolerance(run: RunSettings) -> tuple[str, float]:
    """The table row a run serves with, and its tolerance."""
    if run.backend == "onnxruntime":
        row = "int8" if run.onnxruntime.quantization == "dynamic_int8" else "onnxruntime"
    elif run.backend == "triton":
        row = "triton"
    else:
        row = run.precision
    return row, OUTPUT_TOLERANCE[row]
