"""The offline scenario: every root row, as fast as it goes (MLPerf's Offline).

One predict pass runs every stage over every chunk (retrieve..write through the workload's
chain) and adds its per-pass figures for the repeat statistics: end-to-end rows/s of the
pass (``e2e.predict.rows_per_s`` samples) and the steady compute rows/s of its batches; the
passes after the first add their stage seconds and bytes to
``stage.<stage>.predict.warm_seconds`` and ``stage.<stage>.predict.warm_bytes``.
``run.repeats`` passes each really write (``predict_repeat``); only the last pass writes the
run's prediction file, the others a file of their own that is removed after the pass.

One offline batch: ``run_region`` (region.py) -> ``predict_repeat`` -> ``predict_pass`` ->
``Workload.prepare`` (workload.py) -> ``Chain.prepare`` (tasks/run/chain.py: read ->
preprocess -> (encode) -> tensorize, each step through the flow's runner, a Prefect task) ->
``Chain.serve`` (compute -> calibrate -> write).
"""

from __future__ import annotations

from tasks.measure.records import WarmStage
from tasks.run.scenarios.outputs import ServedOutputs
from tasks.run.scenarios.workload import Workload
from tasks.stages.write import PredictionWriter


def predict_repeat(work: Workload, writer: PredictionWriter, repeat: int, repeats: int) -> None:
    """Pass ``repeat`` of ``repeats``: the last writes to ``writer`` (the run's file); every
    earlier one really writes too (the same work), to a file of its own that is then removed."""
    last = repeat == repeats - 1
    w = writer if last else PredictionWriter(writer.path.with_name(f"{writer.path.stem}.repeat{repeat}.parquet"))
    try:
        predict_pass(work, w, repeat)
    finally:
        if w is not writer:
            w.abort()


def predict_pass(work: Workload, writer: PredictionWriter, repeat: int) -> None:
    """One full predict pass (retrieve..write); per-pass figures feed the repeat stats."""
    result, chain = work.result, work.chain
    sink = work.sink("predict")
    pass_start = result.e2e_seconds("predict")
    stages = result.stages["predict"]
    before = {name: (st.seconds, st.bytes) for name, st in stages.items()}
    engine = chain.engine
    steady_before = len(engine.predict_timings.steady_seconds) if engine else 0
    if engine is not None:  # quality is scored on one pass (the latest); a new engine starts empty
        engine.begin_predict_pass()
        chain.calibration.begin_pass()
    rows = 0
    kept = ServedOutputs() if work.spec.run.check_outputs else None  # references only, the last pass's
    for i in range(len(work.chunks)):
        tz = work.prepare(i, "predict")
        outs = chain.serve(tz, writer, sink, {"chunk": i, "phase": "predict", "repeat": repeat})
        if kept is not None:
            kept.keep(tz.keys, outs)
        rows += tz.root_rows
    work.served_outputs = kept
    result.rows_predicted += rows
    result.predict_passes += 1
    engine = chain.engine
    if engine is not None:
        pt = engine.predict_timings
        secs = sum(pt.steady_seconds[steady_before:])
        if secs > 0:
            result.repeat_steady_rows_per_s.append(sum(pt.steady_rows[steady_before:]) / secs)
    if repeat > 0:  # warm: pass 0 holds the first calls, compilation and cold caches (the floors are warm)
        for name, st in stages.items():
            result.warm_stages.setdefault(name, WarmStage()).add(st, *before[name])
    pass_seconds = result.e2e_seconds("predict") - pass_start
    result.repeat_predict_rows_per_s.append(rows / max(pass_seconds, 1e-12))
