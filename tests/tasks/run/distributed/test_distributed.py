"""``run.distributed``: key sharding and up-front checks (fast), and a real 2-process gloo
training run launched by torchrun from the flow, next to a 1-process run (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from tasks.measure import keys as K
from tasks.measure.records import PhaseTimings
from tasks.run.checks.distributed import check
from tasks.run.distributed.launch import RankReport, failure_text, metrics, shard
from tasks.runtime.errors import UserError
from tasks.spec import parse_spec
from tests.repo import ANY_STEADY, NO_SYSTEM_METRICS, REPO, TINY_RUN

OVERRIDES = [
    *TINY_RUN,
    "run.batch_size=256",  # batches of 256 to shard
    *ANY_STEADY,
    *NO_SYSTEM_METRICS,
    "run.epochs=2",
]


def test_shards_are_disjoint_cover_every_key_and_are_stable():
    keys = np.arange(1, 10_001, dtype=np.int64) * 7
    parts = [shard(keys, r, 3) for r in range(3)]
    assert sum(len(p) for p in parts) == len(keys)
    assert np.array_equal(np.sort(np.concatenate(parts)), keys)
    assert all(len(p) > 3000 for p in parts)  # a hash, not ranges: balanced
    assert np.array_equal(shard(keys, 1, 3), parts[1])
    strings = np.array([f"k{i}" for i in range(100)], dtype=object)
    assert sum(len(shard(strings, r, 2)) for r in range(2)) == 100


def test_distributed_settings_are_checked_before_any_work(shop_spec):
    shop_spec["run"]["distributed"] = {"processes": 3}
    with pytest.raises(UserError, match="divisible"):
        check(parse_spec(shop_spec), torch.device("cpu"))  # batch_size 4 over 3 ranks
    shop_spec["run"]["distributed"] = {"processes": 2, "backend": "nccl"}
    with pytest.raises(UserError, match="CUDA"):
        check(parse_spec(shop_spec), torch.device("cpu"))
    shop_spec["run"]["distributed"] = {"processes": 2}
    shop_spec["run"]["mode"] = "predict"
    with pytest.raises(UserError, match="train\\+predict"):
        check(parse_spec(shop_spec), torch.device("cpu"))
    shop_spec["run"]["mode"] = "train+predict"
    check(parse_spec(shop_spec), torch.device("cpu"))
    shop_spec["run"]["checkpoint"] = "some.ckpt"  # resume is not distributed yet
    with pytest.raises(UserError, match="run.checkpoint"):
        check(parse_spec(shop_spec), torch.device("cpu"))


def test_every_distributed_metric_key_is_catalogued():
    timings = asdict(PhaseTimings(1, first_call_seconds=1.0, steady_seconds=[1.0], steady_rows=[4]))
    reports = [RankReport(r, timings, {}, {}, 10, 3, allreduce_seconds=0.1) for r in range(2)]
    m = metrics(reports, threads=1, reference_rows_per_s=3.0)
    assert m[K.DDP_SCALING_EFFICIENCY] == pytest.approx(8.0 / 6.0)
    assert not [k for k in m if not K.documented(k)]


def _run(tmp: Path, name: str, *sets: str, spec: Path | None = None) -> dict:
    work = tmp / name
    work.mkdir()
    env = dict(
        os.environ,
        MLFLOW_TRACKING_URI=f"sqlite:///{tmp / 'mlflow.db'}",
        PYTHONPATH=str(REPO),
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="600",
    )  # a busy shared host starts it slowly
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "run",
            *([str(spec)] if spec else []),
            *(a for o in [*OVERRIDES, *sets] for a in ("--set", o)),
            "--json",
            str(work / "s.json"),
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((work / "s.json").read_text())


@pytest.mark.slow
def test_two_gloo_processes_train_like_one(tpch_small, tmp_path):
    from mlflow.tracking import MlflowClient

    one = _run(tmp_path, "one")
    two = _run(tmp_path, "two", "run.distributed.processes=2", "run.distributed.backend=gloo")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    m1, m2 = client.get_run(one["run_id"]).data.metrics, client.get_run(two["run_id"]).data.metrics
    # The global batch is the same, so the updates per epoch are too, and quality stays within noise.
    assert m2["compute.train.updates_per_epoch"] == pytest.approx(m1["compute.train.updates_per_epoch"], abs=2)
    assert abs(m2["quality.accuracy"] - m1["quality.accuracy"]) < 0.05, (m1["quality.accuracy"], m2["quality.accuracy"])
    assert m2["compute.train.processes"] == 2 and m2["compute.train.threads_per_process"] == 1
    for key in (
        "compute.train.rank0.rows_per_s",
        "compute.train.rank1.rows_per_s",
        "compute.train.total_rows_per_s",
        "compute.train.reference_rows_per_s",
        "compute.train.scaling_efficiency",
        "compute.train.allreduce_seconds",
        "compute.train.mfu",  # rank 0's steady batch shapes (it read 0: the flow's engine trained nothing)
    ):
        assert m2[key] > 0, key
    # which aggregate the train stages are is tested exactly in test_launch_rank_totals.py; here the
    # ranks' mean is published beside the slowest rank's total
    assert m2["e2e.train.ranks_mean_seconds"] > 0
    # stage bytes are every rank's (they were 0): the shards' tensors add up to the whole
    assert m2["stage.tensorize.train.bytes"] == m1["stage.tensorize.train.bytes"] > 0
    assert m2["stage.retrieve.train.bytes"] > 0 and m2["stage.preprocess.train.bytes"] > 0
    assert m2["compute.train.total_rows_per_s"] == pytest.approx(
        m2["compute.train.rank0.rows_per_s"] + m2["compute.train.rank1.rows_per_s"]
    )
    assert m2["compute.train.scaling_efficiency"] == pytest.approx(
        m2["compute.train.total_rows_per_s"] / (2 * m2["compute.train.reference_rows_per_s"])
    )
    tags = client.get_run(two["run_id"]).data.tags
    rank_keys = [int(k) for k in tags["relflow.distributed.rank_root_keys"].split(",")]
    assert sum(rank_keys) == m2["data.rows_predicted"]  # every root key trained on exactly one rank
    assert client.get_run(two["run_id"]).info.status == "FINISHED"


@pytest.mark.slow
def test_ranks_read_the_database_when_the_spec_names_one(tpch_small, tmp_path):
    """With source.database set, every rank reads its rows from that database: the spec here
    has no table files at all, so a rank that opened files (as ranks once did) fails."""
    import pyarrow.parquet as pq
    import yaml
    from mlflow.tracking import MlflowClient

    from tasks.sources.databases import build_duckdb

    db_file = tmp_path / "tpch.duckdb"
    build_duckdb(tpch_small, db_file)
    raw = yaml.safe_load((REPO / "benchmarks" / "tpch_orders.yaml").read_text())
    raw["source"] = {"database": {"url": f"duckdb:{db_file}"}}
    spec_file = tmp_path / "db_spec.yaml"
    spec_file.write_text(yaml.safe_dump(raw))
    summary = _run(
        tmp_path,
        "ddp_db",
        "run.distributed.processes=2",
        "run.distributed.backend=gloo",
        "run.distributed.reference=false",
        spec=spec_file,
    )
    m = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(summary["run_id"]).data.metrics
    orders = pq.read_metadata(tpch_small / "orders.parquet").num_rows
    lines = pq.read_metadata(tpch_small / "lineitem.parquet").num_rows
    per_rank = [m["data.train.rank0.rows_read"], m["data.train.rank1.rows_read"]]
    assert all(n > 0 for n in per_rank), per_rank
    # one chunk per rank, kept across epochs: together the ranks read every order and line once
    assert sum(per_rank) == orders + lines


def test_a_rank_killed_by_an_abort_is_named_with_what_it_printed():
    # A rank that dies in C++ (gloo) prints its cause before torchrun's Python traceback; the
    # error used to start at the first "Traceback" and say only "Signal 6 (SIGABRT)".
    log = (
        "[W socket.cpp] some warning\n"
        "terminate called after throwing an instance of 'gloo::IoException'\n"
        "  what():  [gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:40211\n"
        'Traceback (most recent call last):\n  File "run.py"\nChildFailedError:\n'
        "  traceback : Signal 6 (SIGABRT) received by PID 26302\n"
    )
    text = failure_text(log)
    assert text.splitlines()[:2] == [
        "terminate called after throwing an instance of 'gloo::IoException'",
        "  what():  [gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:40211",
    ]
    assert "Signal 6 (SIGABRT)" in text and "[W socket.cpp]" not in text
    plain = "Traceback (most recent call last):\nValueError: bad shard\n"
    assert failure_text(plain) == plain  # no abort lines: the traceback as before
