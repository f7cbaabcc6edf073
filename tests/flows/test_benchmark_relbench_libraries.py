"""RelBench tasks on the two real libraries (``model.library: relflow | relational_transformers``).

The social folder (tests/tasks/relbench_folders.py), read and scored by relbench's own classes:

- what each library takes as inputs from the preprocessed task rows: the spec's declared
  columns, the target (relflow's masked field; RT's target cell) and the branches, never the
  entity column, the seed time, the RelBench split or the harness's role columns;
- each library through the whole benchmark flow on the binary and the regression task (tiny
  model, 1 epoch): the run finishes, the RelBench prediction table holds one row per test row,
  ``relbench.submit.evaluate_task`` on it gives the logged ``relbench.<metric>``, quality is the
  test split's (``quality.rows``) and agrees with RelBench's figure (AUC; MAE over the training
  target's spread for NMAE), and the prediction file holds a probability for binary.

Slow: each run imports its library (relflow brings Lightning) and runs a Prefect flow.

Named ``test_benchmark_relbench_libraries.py`` (tests/README.md): test_benchmark.py holds the flow's
main end-to-end test; this file is one aspect of a benchmark-flow run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from tests.tasks.relbench_folders import social, spec_file

LIBRARIES = ("relflow", "relational_transformers")
TASKS = {"user-posts": ("posts_next", "roc_auc"), "user-score": ("score_next", "nmae")}
# RT-J moves information one foreign-key hop per block: likes (2 hops) needs 2 (its checks refuse 1)
TINY = "model: {{library: {library}, d_model: 16, layers: {layers}, heads: 2}}\n"
LAYERS = {"relflow": 1, "relational_transformers": 2}
RUN = (
    "run: {epochs: 1, batch_size: 64, min_steady_batches: 1, min_steady_seconds: 0.001, system_metrics_interval_s: 0}\n"
)
# columns of the task rows (and the harness's role columns) that are never a model input
NOT_INPUTS = ("user_id", "timestamp", "relbench_split", "__train", "__fit", "__scored")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return social(tmp_path_factory.mktemp("relbench") / "social", users=40, posts=600)


def _preprocessed(spec_path: Path):  # -> (Spec, Preprocessed)
    from tasks.sources.open import open_sources
    from tasks.spec import load_spec
    from tasks.stages.preprocess import preprocess
    from tasks.stages.retrieve import list_root_keys, retrieve

    spec = load_spec(spec_path)
    sources = open_sources(spec, spec_path.parent)
    keys, _ = list_root_keys(spec, sources)
    return spec, preprocess(spec, retrieve(spec, sources, keys))


@pytest.mark.parametrize("task", TASKS)
def test_the_libraries_take_only_the_declared_columns_as_inputs(folder, tmp_path, monkeypatch, task):
    from tasks.libraries.relational_transformers import contexts
    from tasks.libraries.relflow.mapping import input_table, trend_column

    monkeypatch.setenv("RELFLOW_DATA_DIR", str(tmp_path / "data"))
    spec, pre = _preprocessed(spec_file(tmp_path, folder, task, extra=TINY.format(library="relflow", layers=1)))
    root, target = spec.schema_.root, spec.task.target
    assert set(NOT_INPUTS) <= set(pre.table.column_names)  # the task rows carry them: the check means something
    assert root.key == "seed_key" and not set(root.columns) & {*NOT_INPUTS, "seed_key", target}

    # relflow: the root key (carried through retain, never a field), the declared columns (each
    # timestamp with its trend), the target (a masked field) and the branch lists
    declared = {c for c in root.columns} | {trend_column(c) for c, k in root.columns.items() if k == "timestamp"}
    branches = {b.name for b in spec.schema_.branches}
    assert set(input_table(spec, pre.table).column_names) == {root.key, target, *declared, *branches}

    # relational-transformers: one column id per declared (node, column), then the target
    built = contexts.build_contexts(pre.table, spec, contexts.fit_stats(pre.table, spec))
    nodes = [(root.table, root.columns), *((b.table, b.columns) for b, _ in spec.schema_.walk())]
    want = [f"{c} of {table}" for table, columns in nodes for c in columns] + [f"{target} of {root.table}"]
    assert built.column_names.to_pylist() == want
    assert built.count == pre.root_rows


def test_a_binary_probability_keeps_the_ranking_of_calibrated_logits_near_zero():
    """A large fitted temperature (T 11,386 in an RT run on the social folder) leaves logits
    near 0; float32 sigmoids tied them at 0.5 and the written file's AUC fell below quality's."""
    import torch

    from tasks.libraries.engine import binary_probability

    logits = torch.tensor([3e-7, 1e-7, 2e-7, 4e-7, -1e-7], dtype=torch.float32)
    written = binary_probability(logits).to_numpy()
    assert written.dtype == np.float64
    assert len(np.unique(written)) == len(logits)  # no ties
    assert list(np.argsort(written)) == list(np.argsort(logits.numpy()))  # the logits' order


def _test_rows(folder: Path, task: str) -> pd.DataFrame:
    return pd.read_parquet(folder / "tasks" / task / "test.parquet")


@pytest.mark.slow
@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("task", TASKS)
def test_a_library_runs_a_relbench_task_end_to_end_and_relbench_scores_its_file(
    prefect_harness, folder, tmp_path, monkeypatch, library, task
):
    from mlflow.tracking import MlflowClient
    from relbench.load import RelBenchDataset
    from relbench.submit import evaluate_task

    from flows.benchmark import benchmark
    from tasks.spec import load_spec

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("RELFLOW_DATA_DIR", str(tmp_path / "data"))
    path = spec_file(
        tmp_path, folder, task, name=f"rb-{library}", extra=TINY.format(library=library, layers=LAYERS[library]) + RUN
    )
    summary = benchmark(spec=load_spec(path).to_dict(), spec_dir=str(tmp_path))
    run = MlflowClient(tracking_uri=uri).get_run(summary["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["model.library"] == library and run.data.tags["relflow.library"] == library
    m = run.data.metrics
    target, metric = TASKS[task]

    # the RelBench prediction table: one row per test row, scored by relbench as logged
    test = _test_rows(folder, task)
    csv = Path(run.data.tags["relflow.relbench_predictions"])
    table = pd.read_csv(csv)
    assert len(table) == len(test) == m["relbench.test_rows"]
    assert list(table.columns) == ["user_id", "timestamp", target]
    ds = RelBenchDataset(folder)
    scored = evaluate_task(f"{ds.manifest.name}/{task}", csv, dataset=ds)
    assert scored[metric] == pytest.approx(m[f"relbench.{metric}"], abs=1e-12)
    assert np.isfinite(m[f"quality.baseline.train_mean.{metric}"]) and np.isfinite(
        m[f"quality.baseline.previous.{metric}"]
    )

    # quality is the test split's, and agrees with RelBench's figure over the same rows
    assert m["quality.rows"] == len(test)
    predictions = pq.read_table(summary["output_path"]).to_pandas()
    assert m["data.rows_predicted"] == len(predictions)  # every task row: train, val and test
    assert predictions["prediction"].dtype == np.float64
    if metric == "roc_auc":
        assert predictions["prediction"].between(0.0, 1.0).all()  # a probability, not a logit
        assert m["quality.auc"] == pytest.approx(m["relbench.roc_auc"], abs=1e-6)
    else:
        spread = pd.read_parquet(folder / "tasks" / task / "train.parquet")[target].std(ddof=1)
        assert m["quality.mae"] / spread == pytest.approx(m["relbench.nmae"], rel=1e-5)
