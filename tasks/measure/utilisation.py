"""Model FLOPs utilisation per compute phase.

``compute[.train].mfu`` counts the useful work: the forward FLOPs of the coordinates present
in the steady batches that ran (each root row at its own shape, tasks/measure/present_flops.py),
times 3 for a training step (forward + backward), over those batches' seconds, against the
host's peak. ``compute[.train].mfu_reserved`` is the older figure, apart: the meta
inspection's FLOPs per root row over the schema's **reserved** shape (packing off) times the
steady exact rows/s. Packing and bucketing skip reserved work, so that one is inflated by about
1/occupancy and is not a utilisation; either above 1 makes the run INVALID (validity.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from tasks.measure import keys as K

TRAIN_FLOPS_FACTOR = 3.0  # backward ~ 2x forward


@dataclass(frozen=True)
class PhaseWork:
    """One phase's steady work: FLOPs per root row at the reserved shape, steady exact rows/s,
    and the forward FLOPs of the present coordinates of its steady batches over their seconds."""

    reserved_flops_per_row: float
    steady_rows_per_s: float
    present_flops: float
    steady_seconds: float


def mfu_metrics(
    peak_flops_per_s: float,
    phases: dict[str, PhaseWork],
    train_rank_peak: float | None = None,
    predict_request_peak: float | None = None,
) -> dict[str, float]:
    """``compute[.train].model_flops_per_s[_reserved]`` and ``.mfu[_reserved]`` per phase.

    ``train_rank_peak``: a DDP run's training is measured in the ranks, each with
    ``run.distributed.threads_per_process`` threads, so its MFU is against the peak at that
    thread count (``compute.train.rank_peak_flops_per_s``), not this process's.
    ``predict_request_peak``: the peak at the thread count the predict compute ran at when it
    was not the process's (an ONNX Runtime session's own, a request run's
    ``run.request.intra_op_threads``): the predict MFU is against it
    (``compute.predict.request_peak_flops_per_s``)."""
    out = {K.HOST_PEAK_FLOPS_PER_S: peak_flops_per_s}
    if train_rank_peak is not None:
        out[K.TRAIN_RANK_PEAK_FLOPS_PER_S] = train_rank_peak
    if predict_request_peak is not None:
        out[K.PREDICT_REQUEST_PEAK_FLOPS_PER_S] = predict_request_peak
    own = {"train": train_rank_peak, "predict": predict_request_peak}

    for phase, w in phases.items():
        phase_peak = own.get(phase)
        peak = phase_peak if phase_peak is not None else peak_flops_per_s

        def share(flops_per_s: float, peak: float = peak) -> float:
            return flops_per_s / peak if peak > 0 else 0.0

        factor = TRAIN_FLOPS_FACTOR if phase == "train" else 1.0
        present = factor * w.present_flops / w.steady_seconds if w.steady_seconds > 0 else 0.0
        reserved = factor * w.reserved_flops_per_row * w.steady_rows_per_s
        out[K.compute(phase, K.MODEL_FLOPS_PER_S)] = present
        out[K.compute(phase, K.MFU)] = share(present)
        out[K.compute(phase, K.MODEL_FLOPS_PER_S_RESERVED)] = reserved
        out[K.compute(phase, K.MFU_RESERVED)] = share(reserved)
    return out


def utilisation_reasons(metrics: dict[str, float]) -> list[str]:
    """A utilisation above 1 means the FLOP count or the peak is wrong: the run is INVALID."""
    reasons = []
    for phase in K.PHASES:
        own = K.TRAIN_RANK_PEAK_FLOPS_PER_S if phase == "train" else K.PREDICT_REQUEST_PEAK_FLOPS_PER_S
        peak_key = own if own in metrics else K.HOST_PEAK_FLOPS_PER_S
        peak = metrics.get(peak_key, 0.0)
        for mfu, flops in ((K.MFU, K.MODEL_FLOPS_PER_S), (K.MFU_RESERVED, K.MODEL_FLOPS_PER_S_RESERVED)):
            value = metrics.get(K.compute(phase, mfu))
            if value is not None and value > 1.0:
                reasons.append(
                    f"{K.compute(phase, mfu)} {value:.2f} > 1: {K.compute(phase, flops)} "
                    f"{metrics.get(K.compute(phase, flops), 0.0):.3g} FLOP/s exceeds "
                    f"{peak_key} {peak:.3g} (the FLOP count or the measured peak is wrong)"
                )
    return reasons
