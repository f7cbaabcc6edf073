"""The floor ledger (tasks/measure/floors.py): floors of known work, fractions, the cache."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tasks.measure import keys as K
from tasks.measure.clock import Clock
from tasks.measure.floors import (
    Floor,
    Ledger,
    _plain_read,
    first_rows,
    fraction,
    fractions,
    gemm_shapes,
    ledger,
    measure,
    memcpy_floor,
    retrieve_floor,
    write_floor,
)
from tasks.sources.files import SourceTable, resolve_sources
from tasks.spec import parse_spec

CPU = torch.device("cpu")


def test_the_memcpy_floor_copies_exactly_the_bytes_it_is_given():
    tensors = [torch.ones(1 << 20, dtype=torch.float32), torch.zeros(1000, dtype=torch.bool)]
    f = memcpy_floor(tensors, Clock(CPU))
    assert f.stage == "tensorize"
    assert f.amount == 4 * (1 << 20) + 1000
    assert f.seconds > 0 and f.rate == f.amount / f.seconds


def test_the_read_floor_counts_the_same_column_chunks_as_retrieve(tmp_path):
    n = 50_000
    table = pa.table({"k": np.arange(n), "x": np.random.default_rng(0).random(n), "unused": np.zeros(n)})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=10_000)
    read, nbytes = _plain_read(SourceTable("t", (path,), "parquet"), ["k", "x"])
    meta = pq.ParquetFile(path).metadata
    expected = sum(meta.row_group(rg).column(i).total_compressed_size for rg in range(5) for i in (0, 1))
    assert meta.num_row_groups == 5 and nbytes == expected
    assert nbytes < sum(meta.row_group(rg).total_byte_size for rg in range(5))  # 'unused' not read
    (got,) = read()
    assert got.column_names == ["k", "x"] and got.num_rows == n


def test_the_read_floor_reads_category_text_as_retrieve_does(tmp_path):
    """Dictionary-encoded where retrieve reads it so: the floor makes the same Arrow types."""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"k": [1, 2, 3], "c": ["a", "b", "a"], "n": [1, 2, 3]}), path)
    read, _ = _plain_read(SourceTable("t", (path,), "parquet"), ["k", "c", "n"], ["c", "n"])
    (got,) = read()
    assert got["c"].type == pa.dictionary(pa.int32(), pa.string())
    assert got["n"].type == pa.int64()  # not text: no dictionary for it


def test_retrieve_and_write_floors_of_the_shop_workload(shop_spec, shop_files, tmp_path):
    spec = parse_spec(shop_spec)
    clock = Clock(CPU)
    f = retrieve_floor(spec, resolve_sources(spec, shop_files), clock)
    assert f.amount > 0 and f.rate > 0 and "parquet" in f.how
    table = pa.table({"k": np.arange(1000), "prediction": np.ones(1000)})
    w = write_floor(table, tmp_path / "out", clock)
    assert w.amount > 0 and w.rate > 0
    assert list((tmp_path / "out").iterdir()) == []  # the floor's file is removed


def test_the_fraction_of_a_stage_that_sleeps_for_a_known_time():
    clock = Clock(CPU)
    nbytes = 1 << 22
    floor = memcpy_floor([torch.ones(nbytes, dtype=torch.uint8)], clock)
    with clock.measure() as span:
        time.sleep(0.05)  # the 'stage': handles nbytes, waits 50 ms (at least)
    got = fraction(nbytes, span.seconds, floor.rate)
    assert got == pytest.approx((nbytes / span.seconds) / floor.rate)
    assert 0 < got <= nbytes / 0.05 / floor.rate  # slept at least 50 ms: never faster than that
    assert fraction(floor.amount, floor.seconds, floor.rate) == pytest.approx(1.0)  # the floor itself
    assert fraction(nbytes, 0.0, floor.rate) == 0.0 and fraction(nbytes, 1.0, 0.0) == 0.0


def test_fractions_of_a_run_from_its_metrics():
    floors = {
        "retrieve": Floor("retrieve", 1000.0, 1.0, ""),  # 1000 B/s
        "tensorize": Floor("tensorize", 4000.0, 1.0, ""),
        "compute": Floor("compute", 1e9, 1.0, ""),  # 1 GFLOP/s
        "write": Floor("write", 100.0, 1.0, ""),
        "orchestration": Floor("orchestration", 10.0, 1.0, ""),  # 10 calls/s
    }
    m = {
        "stage.retrieve.predict.bytes": 500.0,
        "stage.retrieve.predict.seconds": 2.0,  # 250 B/s: a quarter of the floor
        "stage.tensorize.predict.bytes": 4000.0,
        "stage.tensorize.predict.seconds": 1.0,
        "stage.write.predict.bytes": 10.0,
        "stage.write.predict.seconds": 1.0,
        "stage.compute.predict.seconds": 2.0,
        "stage.preprocess.predict.bytes": 300.0,
        "stage.preprocess.predict.seconds": 3.0,
        K.DATA_OCCUPANCY: 0.3,  # not in the count: the reserved shape x occupancy is not it
        # compute.mfu's count: 1e7 present FLOPs per steady row (4e9 FLOP/s at 400 rows/s)
        "compute.model_flops_per_s": 4e9,
        "compute.steady_rows_per_s": 400.0,
        K.E2E_PREDICT_ROWS: 100.0,
        K.E2E_PREDICT_SECONDS: 9.0,
        K.HARNESS_ORCHESTRATION_SECONDS: 2.0,
    }
    out = fractions(Ledger(floors, "k", 0.0, 0.0), m, task_calls=5)
    assert out[K.floor_fraction("retrieve")] == pytest.approx(0.25)
    assert out[K.floor_fraction("tensorize")] == pytest.approx(1.0)
    assert out[K.floor_fraction("write")] == pytest.approx(0.1)
    # present FLOPs: 1e7 per row x 100 rows = 1e9 in 2 s against 1 GFLOP/s (not reserved x
    # occupancy, which the old count used)
    assert out[K.floor_fraction("compute")] == pytest.approx(0.5)
    assert out[K.floor_fraction("orchestration")] == pytest.approx(0.25)  # 2.5 calls/s of 10
    assert out[K.FLOOR_PREPROCESS_INPUT_BYTES_PER_S] == pytest.approx(100.0)
    assert out[K.FLOOR_PREPROCESS_SHARE] == pytest.approx(3.0 / 9.0)
    assert out[K.floor_rate("retrieve")] == 1000.0 and out[K.FLOOR_CACHED] == 0.0
    assert all(K.documented(k) for k in out)
    # a stage the run did not count (no bytes: a request scenario) gets no fraction
    partial = fractions(Ledger(floors, "k", 0.0, 0.0), {K.E2E_PREDICT_ROWS: 0.0}, 0)
    assert not [k for k in partial if k.endswith(".fraction")]


def test_gemm_shapes_follow_the_model_and_the_data(shop_spec):
    spec = parse_spec(shop_spec)
    shapes = gemm_shapes(spec, coords_per_root=10.0)
    d, bs = spec.model.d_model, spec.run.batch_size
    assert shapes[0] == (1, bs * 10, d, d)  # the projections over present coordinates
    assert len(shapes) == 3 + 2 * (1 + len(spec.schema_.walk()))  # linears + scores/values per node
    b, _ = spec.schema_.walk()[0]
    seq = b.max_length * (len(b.columns) + len(b.branches))
    assert (bs * spec.model.heads, seq, d // spec.model.heads, seq) in shapes


@pytest.mark.slow
def test_the_ledger_is_cached_per_host_and_never_from_a_busy_host(shop_spec, shop_files, monkeypatch, tmp_path):
    monkeypatch.setenv("RELFLOW_CACHE_DIR", str(tmp_path / "cache"))
    shop_spec["run"]["output_dir"] = str(tmp_path / "outputs")
    spec = parse_spec(shop_spec)
    sources = resolve_sources(spec, shop_files)
    monkeypatch.setattr("tasks.measure.floors.BUSY_HOST_FRACTION", 1.0)  # caching itself, whatever else runs
    first = ledger(spec, sources, CPU, "fp-test")
    assert not first.cached and set(first.floors) == {"retrieve", "tensorize", "compute", "write"}
    assert all(f.rate > 0 for f in first.floors.values())
    again = ledger(spec, sources, CPU, "fp-test")
    assert again.cached and again.floors == first.floors
    assert not ledger(spec, sources, CPU, "other-host").cached  # per host fingerprint
    assert not ledger(spec, sources, CPU, "fp-test", remeasure=True).cached
    monkeypatch.setattr("tasks.measure.floors.BUSY_HOST_FRACTION", -1.0)  # every host is busy now
    busy = ledger(spec, sources, CPU, "busy-host")
    assert not busy.cached and not ledger(spec, sources, CPU, "busy-host").cached


def _predictions_file(path, keys: list[int], row_group: int):
    table = pa.table({"c_id": pa.array(keys, pa.int64()), "prediction": pa.array([f"p{k % 3}" for k in keys])})
    pq.write_table(table, path, row_group_size=row_group, compression="zstd")
    return table


def test_first_rows_reads_whole_row_groups_and_slices(tmp_path):
    table = _predictions_file(tmp_path / "p.parquet", list(range(10)), row_group=3)
    assert first_rows(tmp_path / "p.parquet", 7).equals(table.slice(0, 7))  # across three row groups
    assert first_rows(tmp_path / "p.parquet", 10).equals(table)
    assert first_rows(tmp_path / "p.parquet", 11) is None  # fewer rows than asked for


def test_after_a_run_the_write_floor_writes_its_predictions_without_a_forward_pass(
    shop_spec, shop_files, tmp_path, monkeypatch
):
    """A finished run's prediction file is the write floor's table: no chunk is served with
    fresh weights only to make one (seconds of every small run); a file with fewer rows than
    the sample (a request scenario's) is not used."""
    from tasks.stages.chain import Chain
    from tasks.stages.retrieve import list_root_keys

    shop_spec["run"]["output_dir"] = str(tmp_path / "outputs")
    spec = parse_spec(shop_spec)
    sources = resolve_sources(spec, shop_files)
    keys, _ = list_root_keys(spec, sources)
    sample = len(keys[: spec.run.chunk_rows])
    served = []
    real_serve = Chain.serve
    monkeypatch.setattr(Chain, "serve", lambda self, *a, **k: served.append(1) or real_serve(self, *a, **k))

    path = tmp_path / "run.parquet"
    table = _predictions_file(path, [int(k) for k in keys] + [99], row_group=2)  # one row more than the sample
    led = measure(spec, sources, CPU, "k", predictions=path)
    assert served == []
    assert led.floors["write"].how == f"write_table of {sample:,} rows"
    pq.write_table(table.slice(0, sample), tmp_path / "same.parquet", compression="zstd")
    assert led.floors["write"].amount == (tmp_path / "same.parquet").stat().st_size  # exactly those rows

    _predictions_file(path, [int(k) for k in keys][:-1], row_group=2)  # fewer rows than the sample
    fallback = measure(spec, sources, CPU, "k", predictions=path)
    assert served == [1] and fallback.floors["write"].how == f"write_table of {sample:,} rows"
