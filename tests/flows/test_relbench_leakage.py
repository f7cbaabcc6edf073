"""Nothing after the seed time reaches a model: a leak planted in a RelBench folder is caught.

``planted`` (tests/tasks/relbench_folders.py): each user's coin-flip label is written into a
``signals`` row one day after the user's seed time. With the as-of rule the model sees only
earlier noise rows and scores at chance on the test split; with the filter switched off (the
test-only ``tasks.stages.asof.FILTER``) the same training reads the label and scores near 1.0.
Both are asserted, so the test fails if the filter stops filtering or the probe stops leaking.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tasks.run.chain import Chain
from tasks.run.scenarios.offline import predict_pass
from tasks.run.scenarios.workload import Workload
from tasks.sources.open import open_sources
from tasks.spec import load_spec
from tasks.stages import asof
from tasks.stages.write import PredictionWriter
from tests.tasks.relbench_folders import planted, spec_file

SMALL = (
    "model: {d_model: 16, layers: 1, heads: 2}\n"
    "run: {epochs: 12, batch_size: 32, learning_rate: 0.01, chunk_rows: 100000}\n"
)


def held_out_auc(folder: Path, work_dir: Path) -> float:
    spec = load_spec(spec_file(work_dir, folder, "coin", extra=SMALL))
    torch.manual_seed(0)
    work = Workload(Chain(spec, open_sources(spec, work_dir), torch.device("cpu")))
    work.list_keys()
    work.train()
    writer = PredictionWriter(work_dir / "p.parquet")
    predict_pass(work, writer, 0)
    writer.commit()
    engine = work.chain.engine
    assert engine is not None
    metrics = engine.quality.metrics()
    assert metrics["rows"] == 120  # the test split: 600 users, the last fifth
    return float(metrics["auc"])


@pytest.mark.slow
def test_a_planted_leak_is_at_chance_with_the_filter_and_perfect_without(tmp_path, monkeypatch):
    monkeypatch.setenv("RELFLOW_DATA_DIR", str(tmp_path / "data"))
    folder = planted(tmp_path / "planted")
    filtered = held_out_auc(folder, tmp_path)
    monkeypatch.setattr(asof, "FILTER", False)
    (tmp_path / "p.parquet").unlink()
    leaked = held_out_auc(folder, tmp_path)
    print(f"auc filtered {filtered:.3f}, leaked {leaked:.3f}")
    assert leaked > 0.95, f"without the filter the label is in the data: auc {leaked:.3f}"
    assert 0.35 < filtered < 0.65, f"with the filter only noise is left: auc {filtered:.3f}"
