"""A RelBench task over the same tables in a database (source.database) instead of db/*.parquet
gives the same labels, the same nested rows and the same predictions."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
import pytest
import torch

from tasks.run.chain import Chain
from tasks.run.scenarios.offline import predict_pass
from tasks.run.scenarios.workload import Workload
from tasks.sources.databases import DatabaseTable, close_all
from tasks.sources.open import open_sources
from tasks.spec import load_spec
from tasks.stages.write import PredictionWriter
from tests.tasks.relbench_folders import social, spec_file

SMALL = "model: {d_model: 16, layers: 1, heads: 2}\nrun: {epochs: 1, batch_size: 32, chunk_rows: 200}\n"


def predictions(spec_path: Path, work_dir: Path, out: Path) -> tuple[pl.DataFrame, list]:
    spec = load_spec(spec_path)
    sources = open_sources(spec, spec_path.parent)
    torch.manual_seed(0)
    work = Workload(Chain(spec, sources, torch.device("cpu")))
    work.list_keys()
    batches = [work.prepare_untimed(i) for i in range(len(work.chunks))]
    labels = [(b.keys.to_pylist(), b.batch.labels.tolist()) for b in batches]  # type: ignore[union-attr]
    work.train()
    writer = PredictionWriter(out)
    predict_pass(work, writer, 0)
    writer.commit()
    kinds = {type(src) for name, src in sources.items() if name != spec.schema_.root.table}
    assert kinds == ({DatabaseTable} if spec.source.database else {type(sources["posts"])})
    return pl.read_parquet(out), labels


@pytest.mark.slow
def test_the_same_task_from_duckdb_gives_the_same_labels_and_predictions(tmp_path, monkeypatch):
    monkeypatch.setenv("RELFLOW_DATA_DIR", str(tmp_path / "data"))
    folder = social(tmp_path / "social", users=40, posts=600)
    db = tmp_path / "social.duckdb"
    with duckdb.connect(str(db)) as con:
        for t in ("users", "posts", "likes"):
            con.execute(f"CREATE TABLE {t} AS SELECT * FROM read_parquet('{folder / 'db' / f'{t}.parquet'}')")
    files = spec_file(tmp_path, folder, "user-posts", name="files", extra=SMALL)
    in_db = tmp_path / "db.yaml"
    source = f"source:\n  database: {{url: 'duckdb:{db}'}}\n"
    in_db.write_text(files.read_text().replace("name: files", "name: db").replace("source:\n", source, 1))
    try:
        a, labels_a = predictions(files, tmp_path, tmp_path / "a.parquet")
        b, labels_b = predictions(in_db, tmp_path, tmp_path / "b.parquet")
    finally:
        close_all()
    assert labels_a == labels_b
    assert a.height == b.height > 0
    assert a["seed_key"].to_list() == b["seed_key"].to_list()
    assert a["prediction"].to_list() == pytest.approx(b["prediction"].to_list(), abs=1e-6)
