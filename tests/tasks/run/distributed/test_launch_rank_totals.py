"""How a DDP job's rank totals become the run's train figures, with hand-made rank reports
whose seconds are known exactly (no torchrun: ``launch`` is replaced by the reports it would
return, everything else is the real flow-side code on the shop workload).

Once: the flow prepared chunk 0 itself and charged it to the train stages, then added the
ranks' stage times on top; and each stage took the slowest rank's seconds, summed over stages,
which is no rank's time at all. And ``compute.train.mfu`` read 0, because the flow's engine,
which trained nothing, had no steady batch shapes.

Named ``test_launch_rank_totals.py`` (tests/README.md): test_launch.py is flows/sweeps/launch.py's
(pytest needs unique basenames)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from tasks.measure import keys as K
from tasks.measure.records import DataTally, PhaseTimings, RunResult, StageTable, TrainingReport
from tasks.run.distributed import launch as distributed
from tasks.run.distributed.launch import RankReport, merge_into, train_stages
from tasks.spec import parse_spec

# rank 0: 7.5 s in all; rank 1: 9.5 s (the slowest). Per-stage maxima would sum to 10.5 s.
RANK_SECONDS = [
    {"retrieve": 1.0, "preprocess": 2.0, "tensorize": 0.5, "compute": 4.0},
    {"retrieve": 3.0, "preprocess": 1.0, "tensorize": 0.5, "compute": 5.0},
]
RANK_ROWS = [
    {"retrieve": 6, "preprocess": 6, "tensorize": 6, "compute": 5},
    {"retrieve": 4, "preprocess": 4, "tensorize": 4, "compute": 3},
]
RANK_BYTES = [
    {"retrieve": 1000, "preprocess": 700, "tensorize": 300},
    {"retrieve": 900, "preprocess": 600, "tensorize": 200},
]
SHAPES = [[2, 3, 5], [1, 1, 2]]  # rank 0's steady batches: 5 roots at (2 orders, 3 lines), 2 at (1, 1)


def _reports() -> list[RankReport]:
    timings = asdict(PhaseTimings(0, first_call_seconds=0.5, steady_seconds=[0.25, 0.25], steady_rows=[4, 3]))
    return [
        RankReport(
            r,
            timings,
            RANK_SECONDS[r],
            RANK_ROWS[r],
            6 - r,
            2,
            rows_read=100 * (r + 1),
            steady_shapes=SHAPES,
            stage_bytes=RANK_BYTES[r],
        )
        for r in range(2)
    ]


def test_train_stages_are_the_slowest_ranks_and_every_ranks_rows():
    agg = train_stages(_reports())
    assert agg.slowest_rank == 1
    assert agg.seconds == RANK_SECONDS[1]
    assert agg.rows == {"retrieve": 10, "preprocess": 10, "tensorize": 10, "compute": 8}
    assert agg.mean_seconds == pytest.approx(8.5)
    table, data = StageTable(), DataTally()
    merge_into(table, data, _reports())
    m = RunResult(
        stages=table.report(), data=data.report(None), training=TrainingReport(1, 2, agg.mean_seconds)
    ).metrics()
    assert m[K.E2E_TRAIN_SECONDS] == pytest.approx(9.5)  # one rank's total, not 10.5
    assert m[K.E2E_TRAIN_ROWS] == 8
    assert m[K.E2E_TRAIN_ROWS_PER_S] == pytest.approx(8 / 9.5)
    assert m["stage.retrieve.train.seconds"] == pytest.approx(3.0)
    assert m["stage.preprocess.train.seconds"] == pytest.approx(1.0)  # rank 1's, not the max (2.0)
    assert m[K.E2E_TRAIN_RANKS_MEAN_SECONDS] == pytest.approx(8.5)
    assert m[K.DATA_ROWS_READ] == 300
    # bytes are every rank's, like rows (they were 0: the ranks never reported them)
    assert m["stage.retrieve.train.bytes"] == 1900
    assert m["stage.preprocess.train.bytes"] == 1300
    assert m["stage.tensorize.train.bytes"] == 500
    assert K.documented(K.E2E_TRAIN_RANKS_MEAN_SECONDS)


def test_the_flows_own_fit_is_not_a_train_stage_and_mfu_counts_rank0s_batches(
    shop_spec, shop_files, tmp_path, monkeypatch
):
    from tasks.measure.present_flops import flops_of_shapes
    from tasks.measure.utilisation import PhaseWork, mfu_metrics
    from tasks.run.chain import Chain
    from tasks.run.scenarios.workload import Workload
    from tasks.sources.files import resolve_sources

    shop_spec["run"]["distributed"] = {"processes": 2, "reference": False}
    spec = parse_spec(shop_spec)
    work = Workload(Chain(spec, resolve_sources(spec, shop_files), torch.device("cpu")))
    work.list_keys()

    def ranks(job: dict, processes: int, threads: int, workdir: Path) -> list[RankReport]:
        assert processes == 2 and job["role"] == "train"
        assert work.chain.engine is not None
        torch.save(work.chain.engine.model.state_dict(), job["weights"])  # what rank 0 hands back
        return _reports()

    monkeypatch.setattr(distributed, "launch", ranks)
    training = distributed.train(work, shop_files, "run-id", "shop", "sqlite:///unused.db")
    assert training == TrainingReport(epochs=1, updates_per_epoch=2, ranks_mean_seconds=8.5)  # rank 0's updates
    m = RunResult(stages=work.stages.report(), data=work.data_report(), training=training).metrics()
    for stage, seconds in RANK_SECONDS[1].items():  # nothing of the flow's chunk-0 fit added
        assert m[f"stage.{stage}.train.seconds"] == seconds, stage
    assert m[K.E2E_TRAIN_SECONDS] == pytest.approx(9.5)
    assert m[K.DATA_ROWS_READ] == 300  # the ranks' reads only
    engine = work.chain.engine
    assert engine is not None
    assert engine.steady_shapes["train"] == Counter({(2, 3): 5, (1, 1): 2})
    assert engine.train_timings.steady_rows == [4, 3]
    present = flops_of_shapes(engine.schema, engine.model.config, ("prediction",), engine.steady_shapes["train"])
    assert present > 0
    mfu = mfu_metrics(1e12, {"train": PhaseWork(1.0, 14.0, present, 0.5)})[K.compute("train", K.MFU)]
    assert mfu == pytest.approx(3.0 * present / 0.5 / 1e12)
