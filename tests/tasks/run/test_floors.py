"""The floor ledger (tasks/run/floors.py): floors of known work, fractions, the cache."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tasks.measure import keys as K
from tasks.measure.clock import Clock
from tasks.run.floors import (
    Floor,
    Ledger,
    _plain_read,
    best_seconds,
    first_rows,
    fraction,
    fractions,
    gemm_shapes,
    ledger,
    measure,
    memcpy_floor,
    present_lengths,
    retrieve_floor,
    write_floor,
)
from tasks.sources.files import SourceTable, resolve_sources
from tasks.spec import parse_spec

CPU = torch.device("cpu")


class Ticks:
    """A scripted clock: each read moves ``step`` seconds on, whatever the host does."""

    def __init__(self, step: float) -> None:
        self.t, self.step = 0.0, step
        self.clock = Clock(None, now=self.now)

    def now(self) -> float:
        self.t += self.step
        return self.t


def test_best_seconds_is_the_fastest_timed_call_after_an_untimed_warm_up():
    """The step moves a scripted clock by known seconds per call: 100 s for the warm-up (cold
    caches, compilation), then 3, 2, 5, 2.5 and 4 s. The floor is 2 s: the warm-up is not a
    candidate, the best warm call is."""
    now = [0.0]
    costs = iter([100.0, 3.0, 2.0, 5.0, 2.5, 4.0])

    def step() -> None:
        now[0] += next(costs)

    assert best_seconds(step, Clock(None, now=lambda: now[0])) == 2.0
    assert next(costs, None) is None  # one warm-up and five timed calls, no more


def test_the_memcpy_floor_copies_exactly_the_bytes_it_is_given():
    tensors = [torch.ones(1 << 20, dtype=torch.float32), torch.zeros(1000, dtype=torch.bool)]
    f = memcpy_floor(tensors, Ticks(0.5).clock)  # every timed copy reads as 0.5 s
    assert f.stage == "tensorize"
    assert f.amount == 4_195_304.0  # 4 MiB of float32 and 1000 bools
    assert f.seconds == 0.5 and f.rate == 8_390_608.0


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


def test_a_fraction_is_the_stages_rate_over_the_floors():
    # 1000 B in 2 s (500 B/s) against a floor of 2000 B/s: a quarter of the floor
    assert fraction(1000.0, 2.0, 2000.0) == 0.25
    assert fraction(1000.0, 0.0, 2000.0) == 0.0 and fraction(1000.0, 1.0, 0.0) == 0.0  # unknown: none


FLOORS = {
    "retrieve": Floor("retrieve", 1000.0, 1.0, ""),  # 1000 B/s
    "tensorize": Floor("tensorize", 4000.0, 1.0, ""),
    "compute": Floor("compute", 1e9, 1.0, ""),  # 1 GFLOP/s
    "write": Floor("write", 100.0, 1.0, ""),
    "orchestration": Floor("orchestration", 10.0, 1.0, ""),  # 10 calls/s
}


def test_fractions_set_the_warm_passes_against_the_warm_floors():
    """Three passes; pass 0 held the first calls (slow), passes 1-2 are the warm figures the
    floors (warm bests of 5) are set against. Each expected value is worked by hand."""
    m = {
        # all three passes, pass 0 included: what the old fractions used
        K.stage_bytes("retrieve", "predict"): 900.0,
        K.stage_seconds("retrieve", "predict"): 9.0,
        K.stage_bytes("tensorize", "predict"): 12000.0,
        K.stage_seconds("tensorize", "predict"): 30.0,
        K.stage_bytes("write", "predict"): 30.0,
        K.stage_seconds("write", "predict"): 6.0,
        K.stage_seconds("compute", "predict"): 50.0,
        # passes 1 and 2
        K.stage_warm_bytes("retrieve"): 500.0,
        K.stage_warm_seconds("retrieve"): 2.0,  # 250 B/s of 1000
        K.stage_warm_bytes("tensorize"): 8000.0,
        K.stage_warm_seconds("tensorize"): 4.0,  # 2000 B/s of 4000
        K.OUTPUT_BYTES: 10.0,
        K.E2E_PREDICT_PASSES: 3.0,
        K.stage_warm_seconds("write"): 2.0,  # 2 x 10 B in 2 s: 10 B/s of 100
        # the steady batches' present FLOPs over their own seconds: 4e8 FLOP/s of 1e9
        K.compute("predict", K.MODEL_FLOPS_PER_S): 4e8,
        K.compute("predict", "steady_rows_per_s"): 400.0,
        K.E2E_PREDICT_ROWS: 300.0,
        K.DATA_OCCUPANCY: 0.3,
        K.stage_bytes("preprocess", "predict"): 300.0,
        K.stage_seconds("preprocess", "predict"): 3.0,
        K.E2E_PREDICT_SECONDS: 9.0,
        K.HARNESS_ORCHESTRATION_SECONDS: 2.0,
    }
    out = fractions(Ledger(FLOORS, "k", 0.0, 0.0), m, task_calls=5)
    assert out[K.floor_fraction("retrieve")] == pytest.approx(0.25)  # the old, all-pass figure: 0.1
    assert out[K.floor_fraction("tensorize")] == pytest.approx(0.5)  # old: 0.1
    assert out[K.floor_fraction("write")] == pytest.approx(0.1)  # old: 3 x 10 B in 6 s, 0.05
    assert out[K.floor_fraction("compute")] == pytest.approx(0.4)  # old: 3e8 present FLOPs in 50 s, 0.006
    assert out[K.floor_fraction("orchestration")] == pytest.approx(0.25)  # 5 calls in 2 s of 10/s
    assert out[K.FLOOR_PREPROCESS_INPUT_BYTES_PER_S] == pytest.approx(100.0)
    assert out[K.FLOOR_PREPROCESS_SHARE] == pytest.approx(3.0 / 9.0)
    assert out[K.floor_rate("retrieve")] == 1000.0 and out[K.FLOOR_CACHED] == 0.0
    assert all(K.documented(k) for k in out)


def test_one_pass_has_no_warm_figure_and_no_byte_stage_fraction():
    """run.repeats 1 (or a request run): no warm passes, so no byte-stage fraction; compute's
    steady batches are warm in any run."""
    m = {
        K.stage_bytes("retrieve", "predict"): 900.0,
        K.stage_seconds("retrieve", "predict"): 9.0,
        K.OUTPUT_BYTES: 10.0,
        K.E2E_PREDICT_PASSES: 1.0,
        K.stage_warm_seconds("write"): 0.0,
        K.compute("predict", K.MODEL_FLOPS_PER_S): 2e8,
    }
    out = fractions(Ledger(FLOORS, "k", 0.0, 0.0), m, task_calls=0)
    assert [k for k in out if k.endswith(".fraction")] == [K.floor_fraction("compute")]
    assert out[K.floor_fraction("compute")] == pytest.approx(0.2)


def test_gemm_shapes_follow_the_model_and_the_data(shop_spec):
    """The shop (d_model 8, 2 heads: dh 4): root 3 columns + 1 branch, orders 3 columns + 1
    branch (max_length 2), lines 2 columns (max_length 3); 10 present coordinates per root."""
    spec = parse_spec(shop_spec)
    bs = spec.run.batch_size
    linears = [(1, bs * 10, 8, 8), (1, bs * 10, 8, 32), (1, bs * 10, 32, 8)]
    # at the reserved lengths: orders 2 x 4 tokens over bs roots, lines 3 x 2 over 2 bs orders
    assert gemm_shapes(spec, coords_per_root=10.0) == [
        *linears,
        *[(bs * 2, 4, 4, 4), (bs * 2, 4, 4, 4)],
        *[(bs * 2, 8, 4, 8), (bs * 2, 8, 8, 4)],
        *[(bs * 2 * 2, 6, 4, 6), (bs * 2 * 2, 6, 6, 4)],
    ]
    # at present lengths 1 and 1: orders 1 x 4 tokens, lines 1 x 2 over bs orders
    assert gemm_shapes(spec, coords_per_root=10.0, lengths={"orders": 1, "lines": 1}) == [
        *linears,
        *[(bs * 2, 4, 4, 4), (bs * 2, 4, 4, 4)],
        *[(bs * 2, 4, 4, 4), (bs * 2, 4, 4, 4)],
        *[(bs * 2, 2, 4, 2), (bs * 2, 2, 2, 4)],
    ]


def test_present_lengths_are_the_roots_longest_present_instances(shop_spec, shop_files, prepare_chunk):
    """By hand from the shop tables: orders kept per customer (max 2, earliest first) 2, 1, 0,
    2, 1 (mean 1.2); the longest kept order's lines (max 3) 3 (order 10), 1 (20), 0, 2 (41),
    0 (50): mean 1.2. Both round to 1, under the reserved 2 and 3 the floor used before."""
    _, _, schema, tz = prepare_chunk(shop_spec, shop_files)
    assert present_lengths(tz, schema) == {"orders": 1, "lines": 1}


@pytest.mark.parametrize(("scenario", "threads"), [("single_stream", 1), ("server", 1), ("offline", 2)])
def test_the_ledger_runs_at_the_threads_the_predict_work_ran_at(
    shop_spec, shop_files, monkeypatch, tmp_path, scenario, threads
):
    """Requests run at run.request.intra_op_threads (1 by default), offline passes at the
    process's (2 here): each ledger is measured at its run's count (the old one at the
    process's for both), and the process's count is put back."""
    monkeypatch.setenv("RELFLOW_CACHE_DIR", str(tmp_path / "cache"))
    shop_spec["run"]["output_dir"] = str(tmp_path / "outputs")
    shop_spec["run"]["scenario"] = scenario
    spec = parse_spec(shop_spec)
    seen: list[int] = []

    def orchestration(clock: Clock) -> Floor:  # the floor the flow hands in, measured last
        seen.append(torch.get_num_threads())
        return Floor("orchestration", 1.0, 1.0, "")

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        led = ledger(spec, resolve_sources(spec, shop_files), CPU, "fp-test", orchestration)
        assert seen == [threads] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert not led.cached


@pytest.mark.slow
def test_the_ledger_is_cached_per_host_and_never_from_a_busy_host(shop_spec, shop_files, monkeypatch, tmp_path):
    monkeypatch.setenv("RELFLOW_CACHE_DIR", str(tmp_path / "cache"))
    shop_spec["run"]["output_dir"] = str(tmp_path / "outputs")
    spec = parse_spec(shop_spec)
    sources = resolve_sources(spec, shop_files)
    monkeypatch.setattr("tasks.run.floors.BUSY_HOST_FRACTION", 1.0)  # caching itself, whatever else runs
    first = ledger(spec, sources, CPU, "fp-test")
    assert not first.cached and set(first.floors) == {"retrieve", "tensorize", "compute", "write"}
    assert all(f.rate > 0 for f in first.floors.values())
    again = ledger(spec, sources, CPU, "fp-test")
    assert again.cached and again.floors == first.floors
    assert not ledger(spec, sources, CPU, "other-host").cached  # per host fingerprint
    assert not ledger(spec, sources, CPU, "fp-test", remeasure=True).cached
    monkeypatch.setattr("tasks.run.floors.BUSY_HOST_FRACTION", -1.0)  # every host is busy now
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
    from tasks.run.chain import Chain
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


@pytest.mark.slow
def test_a_library_gets_no_reference_model_floors_and_its_own_cache_entry(shop_spec, shop_files, tmp_path):
    """relational-transformers' tensors are plan indices and its kernels are not the reference
    model's GEMMs: its ledger has no tensorize or compute floor (none is better than a wrong
    one), and it never reuses the reference run's cached ledger (issue 43 item 5)."""
    from tasks.run.floors import data_key

    shop_spec["run"]["output_dir"] = str(tmp_path / "outputs")
    reference = parse_spec(shop_spec)
    library = parse_spec({**shop_spec, "model": {**shop_spec.get("model", {}), "library": "relational_transformers"}})
    sources = resolve_sources(reference, shop_files)
    assert data_key(reference, sources, CPU) != data_key(library, sources, CPU)
    assert {"tensorize", "compute"} <= set(measure(reference, sources, CPU, "k").floors)
    floors = measure(library, sources, CPU, "k").floors
    assert "tensorize" not in floors and "compute" not in floors
    assert {"retrieve", "write"} <= set(floors)  # the data's floors are the library's too
