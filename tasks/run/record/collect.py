"""A run's figures read from the engine after the timed region.

The flow (flows/benchmark.py) only orders the work: ``engine_figures`` returns what the model
under test's engine recorded (``EngineBase``, any library) as an ``EngineReport``, which the
record (``RunResult.engine``) holds; ``utilisation`` its MFU. Figures only the reference model
has come through ``ModelFacts`` or ``EngineBase.present_flops`` (present-shape FLOPs), or from
``ModelSide.reference_engine`` (fp8 fallbacks).
"""

from __future__ import annotations

import copy

import torch

from model.quantize import fp8_fallback_calls
from tasks.measure import keys as K
from tasks.measure.environment import fingerprint
from tasks.measure.records import (
    PHASES,
    BatchCoordinates,
    CompileCounters,
    CompilerCache,
    EngineReport,
    PhaseTimings,
)
from tasks.measure.utilisation import PhaseWork, mfu_metrics
from tasks.run.chain import Chain
from tasks.run.peak_flops import peak_flops
from tasks.spec import Spec
from tasks.stages.calibrate import CALIBRATED_KINDS
from tasks.stages.engine import EngineBase, ModelFacts, compile_cache_counts, compiled_frames


def compiler_cache_state(hits: int, misses: int) -> CompilerCache:
    """``cold`` (every compiled graph built here), ``warm`` (every one from the on-disk cache),
    ``mixed``, or ``none`` (nothing compiled)."""
    if hits and misses:
        return "mixed"
    return "warm" if hits else "cold" if misses else "none"


def engine_figures(chain: Chain, engine: EngineBase, predict_units: int) -> EngineReport:
    """What ``engine`` recorded (timings, compilation, coordinates, quality, calibration), its
    timings copied; ``predict_units`` are the predict passes (offline) or served requests the
    batch figures are per."""
    frames = compiled_frames() - engine.frames_at_start
    hits, misses = (now - then for now, then in zip(compile_cache_counts(), engine.compile_cache_at_start, strict=True))
    quality = engine.quality.metrics()
    # the headline's bootstrap interval: a RelBench task's units are its entities (seed keys)
    quality.update(engine.quality.interval(by_entity=chain.spec.source.relbench is not None))
    quality.update(chain.calibration.metrics())
    reference = chain.side.reference_engine()  # model/'s weights, served natively in fp8 or not
    return EngineReport(
        predict=copy.deepcopy(engine.predict_timings),
        train=copy.deepcopy(engine.train_timings) if chain.spec.run.mode == "train+predict" else None,
        compute_seconds=engine.wall_seconds,
        worker_startup_seconds=engine.worker_startup_seconds,
        recompiles={phase: engine.recompiles(phase) for phase in PHASES},
        graph_breaks={phase: engine.graph_breaks_after_warmup(phase) for phase in PHASES},
        compile=CompileCounters(frames, hits, misses),
        compiler_cache=compiler_cache_state(hits, misses),
        batch_coordinates=BatchCoordinates.of(engine.batch_coords, predict_units, len(engine.batch_shapes)),
        quality=quality,
        temperature=chain.temperature,
        # held-out rows the temperature was not fitted on
        calibration_report_rows=chain.calibration.rows if chain.spec.task.kind in CALIBRATED_KINDS else None,
        fp8_fallback_calls=fp8_fallback_calls(reference.model) if reference is not None else None,
        # after the passes: weights_native reads their fp8 fallbacks (MLflow stores tags as text)
        backend_tags={k: str(v) for k, v in engine.backend_tags().items()},
    )


def utilisation(
    spec: Spec, device: torch.device, engine: EngineBase, facts: ModelFacts, predict_threads: int | None = None
) -> dict[str, float]:
    """MFU per phase against this host's cached peak (measured here, outside the timed
    region, on a cache miss). A library with no FLOPs count publishes none (its
    ``ModelFacts.flops_note`` says why). ``predict_threads``: the intra-op thread count the
    predict compute ran at when it was not simply the process's (``invocation.predict_threads``:
    an ONNX Runtime session's own, or a request scenario's ``run.request.intra_op_threads``):
    its MFU is against the peak at that count."""
    cells = engine.steady_cells if facts.flop_model is not None else None
    cell_library = cells is not None and cells.contexts > 0
    # present-shape FLOPs: an engine that counts its batches' shapes (the reference model's)
    predict = engine.present_flops("predict") if facts.flops_per_root_row is not None else None
    if facts.flops_per_root_row is None or not (predict is not None or cell_library):
        return {}  # no count, or a library's per-row count that cannot tell present from reserved
    host = fingerprint(device)["relflow.host_fingerprint"]
    peak = peak_flops(host, device, spec.run.precision)
    phases: dict[str, PhaseWork] = {}
    if predict is not None:

        def work(t: PhaseTimings, flops: tuple[float, float]) -> PhaseWork:
            reserved, present = flops
            return PhaseWork(reserved, t.steady_rows_per_s, present, float(sum(t.steady_seconds)))

        phases["predict"] = work(engine.predict_timings, predict)
        train = engine.present_flops("train") if spec.run.mode == "train+predict" else None
        if train is not None:
            phases["train"] = work(engine.train_timings, train)
    else:
        assert facts.flop_model is not None and cells is not None
        # a cell-context library (tasks/measure/cell_flops.py): the steady batches' FLOPs at
        # their padded lengths (reserved: what ran) and at each context's own (present)
        t, fm = engine.predict_timings, facts.flop_model
        padded_per_row = cells.padded_flops(fm) / cells.contexts
        phases["predict"] = PhaseWork(
            padded_per_row, t.steady_rows_per_s, float(cells.present_flops(fm)), sum(t.steady_seconds)
        )
    rank_peak = None
    if spec.run.distributed is not None and "train" in phases:  # the ranks trained, at their own thread count
        threads = spec.run.distributed.threads_per_process
        rank_peak = peak_flops(host, device, spec.run.precision, threads=threads).flops_per_s
    request_peak = None
    if predict_threads is not None:  # predict ran at its own thread count (a session's, the requests')
        request_peak = peak_flops(host, device, spec.run.precision, threads=predict_threads).flops_per_s
    return {**mfu_metrics(peak.flops_per_s, phases, rank_peak, request_peak), K.HOST_PEAK_CACHED: float(peak.cached)}
