"""Model FLOPs utilisation per compute phase.

``model FLOPs`` follow the usual MFU convention: the FLOPs the model's definition needs per
root row (the meta inspection's count over the schema's reserved coordinates: matmuls and
attention, forward), times 3 for a training step (forward + backward), times the steady
exact rows/s of that phase. Work the runtime skips (packing absent coordinates) still counts
as model work, so packing shows up as higher MFU, as it should: same model, less time.
"""

from __future__ import annotations

from tasks.measure import keys as K

TRAIN_FLOPS_FACTOR = 3.0  # backward ~ 2x forward


def mfu_metrics(peak_flops_per_s: float, phases: dict[str, tuple[float, float]]) -> dict[str, float]:
    """``compute[.train].model_flops_per_s`` and ``.mfu`` for each phase.

    ``phases`` maps a phase to (forward FLOPs per root row, steady exact rows/s)."""
    out = {K.HOST_PEAK_FLOPS_PER_S: peak_flops_per_s}
    for phase, (forward_flops_per_row, rows_per_s) in phases.items():
        per_row = forward_flops_per_row * (TRAIN_FLOPS_FACTOR if phase == "train" else 1.0)
        achieved = per_row * rows_per_s
        out[K.compute(phase, K.MODEL_FLOPS_PER_S)] = achieved
        out[K.compute(phase, K.MFU)] = achieved / peak_flops_per_s if peak_flops_per_s > 0 else 0.0
    return out
