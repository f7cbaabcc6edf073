"""The offline scenario: every root row, as fast as it goes (MLPerf's Offline).

``run_offline`` runs ``run.repeats`` predict passes and returns their report
(``OfflineReport``, tasks/measure/records.py) with the last pass's served rows for the output
check (``OfflineRun``). One pass runs every stage over every chunk (retrieve..write through the
workload's chain) and returns its figures (``PassFigures``): its rows, its end-to-end rows/s
(``e2e.predict.rows_per_s`` samples), the steady compute rows/s of its batches and each
stage's table across it (the passes after the first give ``stage.<stage>.predict.warm_seconds``
and ``warm_bytes``). Each pass really writes (``predict_repeat``); only the last writes the
run's prediction file, the others a file of their own that is removed after the pass.

One offline batch: ``run_region`` (region.py) -> ``run_offline`` -> ``predict_repeat`` ->
``predict_pass`` -> ``Workload.prepare`` (workload.py) -> ``Chain.prepare`` (tasks/run/chain.py:
read -> preprocess -> (encode) -> tensorize, each step through the flow's runner, a Prefect
task) -> ``Chain.serve`` (compute -> calibrate -> write).
"""

from __future__ import annotations

from dataclasses import dataclass

from tasks.measure.records import OfflineReport, PassFigures, StagePass
from tasks.run.scenarios.outputs import ServedOutputs
from tasks.run.scenarios.workload import Workload
from tasks.stages.write import PredictionWriter


@dataclass(frozen=True)
class OfflineRun:
    """What the offline scenario returns: its report, and the last pass's served rows."""

    report: OfflineReport
    served_outputs: ServedOutputs | None  # run.check_outputs: references, for the untimed check


def run_offline(work: Workload, writer: PredictionWriter, repeats: int) -> OfflineRun:
    """``repeats`` passes, folded into the report; the last writes to ``writer``."""
    passes: list[PassFigures] = []
    kept = None
    for repeat in range(repeats):
        figures, kept = predict_repeat(work, writer, repeat, repeats)  # only the latest pass's rows held
        passes.append(figures)
    return OfflineRun(OfflineReport.of(passes), kept)


def predict_repeat(
    work: Workload, writer: PredictionWriter, repeat: int, repeats: int
) -> tuple[PassFigures, ServedOutputs | None]:
    """Pass ``repeat`` of ``repeats``: the last writes to ``writer`` (the run's file); every
    earlier one really writes too (the same work), to a file of its own that is then removed."""
    last = repeat == repeats - 1
    w = writer if last else PredictionWriter(writer.path.with_name(f"{writer.path.stem}.repeat{repeat}.parquet"))
    try:
        return predict_pass(work, w, repeat)
    finally:
        if w is not writer:
            w.abort()


def predict_pass(work: Workload, writer: PredictionWriter, repeat: int) -> tuple[PassFigures, ServedOutputs | None]:
    """One full predict pass (retrieve..write): its figures, and (``run.check_outputs``) its
    served rows by reference."""
    chain = work.chain
    sink = work.sink("predict")
    pass_start = work.stages.seconds("predict")
    stages = work.stages["predict"]
    before = {name: (st.seconds, st.bytes) for name, st in stages.items()}
    engine = chain.engine
    steady_before = len(engine.predict_timings.steady_seconds) if engine else 0
    if engine is not None:  # quality is scored on one pass (the latest); a new engine starts empty
        engine.begin_predict_pass()
        chain.calibration.begin_pass()
    rows = 0
    kept = ServedOutputs() if work.spec.run.check_outputs else None  # references only
    for i in range(len(work.chunks)):
        tz = work.prepare(i, "predict")
        outs = chain.serve(tz, writer, sink, {"chunk": i, "phase": "predict", "repeat": repeat})
        if kept is not None:
            kept.keep(tz.keys, outs)
        rows += tz.root_rows
    steady = None
    engine = chain.engine
    if engine is not None:
        pt = engine.predict_timings
        secs = sum(pt.steady_seconds[steady_before:])
        if secs > 0:
            steady = sum(pt.steady_rows[steady_before:]) / secs
    pass_seconds = work.stages.seconds("predict") - pass_start
    figures = PassFigures(
        rows=rows,
        rows_per_s=rows / max(pass_seconds, 1e-12),
        steady_rows_per_s=steady,
        stages={name: StagePass(*before[name], st.seconds, st.bytes) for name, st in stages.items()},
    )
    return figures, kept
