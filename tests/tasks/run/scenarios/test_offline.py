"""Cold start (issue 19): the calibration fit must not compile (and so warm) the graphs the
predict path runs, so predict's first call still includes their compilation."""

from __future__ import annotations

import copy

import pytest
import torch

from tasks.measure.records import RunResult
from tasks.run.chain import Chain
from tasks.run.scenarios.offline import predict_pass
from tasks.run.scenarios.workload import Workload
from tasks.sources.files import resolve_sources
from tasks.spec import parse_spec
from tasks.stages import compute as compute_stage
from tasks.stages.write import PredictionWriter

pytestmark = pytest.mark.slow  # a real compile of the calibration fit and the first predict


def test_calibration_fit_compiles_nothing_so_predict_first_call_compiles(shop_spec, many_shop_files, tmp_path):
    shop_files = many_shop_files
    raw = copy.deepcopy(shop_spec)
    # Dynamo with the eager backend: every region really goes through Dynamo (graphs counted)
    # at a fraction of Inductor's cost.
    raw["run"]["compile"] = {"encoders": True, "pools": True, "backend": "eager", "dynamic": True}
    raw["run"]["batch_size"] = 64  # one batch per step: no shape-driven recompiles
    raw["task"]["validation_fraction"] = 0.3
    spec = parse_spec(raw)
    work = Workload(Chain(spec, resolve_sources(spec, shop_files), torch.device("cpu")), RunResult())
    work.list_keys()
    work.train()
    before_fit = compute_stage.compiled_frames()
    work.fit_calibration()
    assert compute_stage.compiled_frames() == before_fit, "the calibration fit compiled graphs"
    assert work.result.calibration.fit_rows > 0  # it did fit, on eager regions
    writer = PredictionWriter(tmp_path / "p.parquet")
    before_predict = compute_stage.compiled_frames()
    predict_pass(work, writer, 0)
    writer.abort()
    # predict's own first call compiled its eval graphs: the figure includes that compile
    assert compute_stage.compiled_frames() > before_predict
    # calibration quality is scored on the held-out cells the fit did not use, all of them
    fit_rows, report_rows = work.result.calibration.fit_rows, work.chain.calibration.rows
    assert report_rows > 0 and fit_rows + report_rows == work.chain.engine.quality.metrics()["rows"]
