"""bench_asof's figures on scripted records, and the task it writes on a tiny rel-tpch copy."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_asof import ratio_lines, ratios, seed_times, table_line, write_task  # noqa: E402


def record(scale: float, seeds: int, rows_per_s: float, setup: float, chunk: float, passes: float) -> dict:
    return {
        "scale": scale,
        "seeds": seeds,
        "rows": 100 * seeds,
        "chunks": seeds,
        "task_rows_s": 0.1,
        "retrieve_s": 0.2,
        "preprocess_s": 0.3,
        "rows_per_s": rows_per_s,
        "rows_per_cpu_s": rows_per_s / 2,
        "kept_per_row": {"orders": 7.5, "lineitem": 22.0},
        "setup_peak_mib": setup,
        "baseline_mib": setup,
        "chunk_mib": chunk,
        "passes_peak_mib": passes,
        "process_peak_mib": max(setup, passes),
    }


def test_ratios_flag_a_throughput_that_falls_with_seed_times():
    recs = [record(0.1, 1, 30_000, 600, 40, 640), record(0.1, 64, 12_000, 600, 40, 640)]
    (s,) = ratios(recs).values()
    assert s["seeds"] == [1, 64]
    assert s["throughput_ratio"] == pytest.approx(2.5)  # 30,000 / 12,000
    assert s["cpu_throughput_ratio"] == pytest.approx(2.5)
    assert not s["throughput_goal_met"]
    assert s["memory_goal_met"] and s["process_growth_mib"] == 0.0
    assert "2.50x" in ratio_lines(ratios(recs))[0] and "MISSED" in ratio_lines(ratios(recs))[0]


def test_ratios_use_the_fewest_and_most_seed_times_per_scale_in_any_order():
    recs = [
        record(0.01, 16, 20_000, 600, 30, 660),
        record(0.01, 64, 18_000, 610, 30, 700),
        record(0.01, 1, 20_000, 600, 30, 650),
        record(0.1, 4, 10_000, 700, 50, 760),
    ]
    got = ratios(recs)
    assert list(got) == ["0.01"]  # one configuration at 0.1: nothing to compare
    s = got["0.01"]
    assert s["seeds"] == [1, 64] and s["rows"] == [100, 6400]
    assert s["throughput_ratio"] == pytest.approx(20_000 / 18_000)
    assert s["throughput_goal_met"]
    assert s["process_growth_mib"] == pytest.approx(50.0)  # 700 - 650
    assert s["setup_growth_mib"] == pytest.approx(10.0) and s["passes_growth_mib"] == pytest.approx(50.0)
    assert s["process_ratio"] == pytest.approx(700 / 650)
    assert s["chunk_mib"] == 30.0 and not s["memory_goal_met"]  # grew by more than one chunk


def test_memory_goal_allows_growth_up_to_one_chunk():
    recs = [record(0.1, 1, 1.0, 600, 40, 650), record(0.1, 64, 1.0, 600, 40, 690)]
    assert ratios(recs)["0.1"]["memory_goal_met"]  # +40 MiB: exactly one chunk
    recs[1]["passes_peak_mib"] = recs[1]["process_peak_mib"] = 691.0
    assert not ratios(recs)["0.1"]["memory_goal_met"]


def test_table_line_shows_the_figures():
    line = table_line(record(0.01, 64, 41_318.2, 661.4, 16.3, 739.8))
    assert line.split() == [
        "0.01",
        "64",
        "6,400",
        "64",
        "0.10",
        "0.20",
        "0.30",
        "41,318",
        "20,659",
        "7.50",
        "22.00",
    ] + [
        "661",
        "16",
        "740",
        "740",
    ]


def test_seed_times_end_at_the_validation_timestamp_30_days_apart():
    val = dt.datetime(1997, 6, 1)
    got = seed_times(val, 3)
    assert got == [dt.datetime(1997, 4, 2), dt.datetime(1997, 5, 2), val]


def test_write_task_holds_the_same_customers_at_each_seed_time_with_their_labels(tmp_path: Path):
    src = tmp_path / "rel-tpch"
    (src / "db").mkdir(parents=True)
    (src / "tasks" / "customer-churn").mkdir(parents=True)
    (src / "manifest.yaml").write_text(yaml.safe_dump({"name": "rel-tpch", "val_timestamp": "1997-06-01"}))
    (src / "tasks" / "customer-churn" / "manifest.yaml").write_text("name: customer-churn\n")
    d = dt.datetime
    pl.DataFrame(
        {
            "o_custkey": [1, 1, 2, 3],
            # customer 1: an order before every seed time and one in (1997-05-02, +90 days];
            # customer 2: only after the earliest seed time (left out); 3: one early order
            "o_orderdate": [d(1997, 1, 1), d(1997, 5, 10), d(1997, 5, 1), d(1997, 3, 1)],
        }
    ).write_parquet(src / "db" / "orders.parquet")
    rows = write_task(src, tmp_path / "copy", n=2, most=3)  # earliest of 3 seed times: 1997-04-02
    assert rows == 4
    assert (tmp_path / "copy" / "db").resolve() == (src / "db").resolve()
    train = pl.read_parquet(tmp_path / "copy" / "tasks" / "customer-churn" / "train.parquet")
    assert train.columns == ["timestamp", "c_custkey", "orders_next_90d"]
    assert train.rows() == [
        (d(1997, 5, 2), 1, 1),  # orders on 1997-05-10, within 90 days
        (d(1997, 5, 2), 3, 0),
        (d(1997, 6, 1), 1, 0),  # nothing after 1997-06-01
        (d(1997, 6, 1), 3, 0),
    ]
    for split in ("val", "test"):
        empty = pl.read_parquet(tmp_path / "copy" / "tasks" / "customer-churn" / f"{split}.parquet")
        assert empty.height == 0 and empty.schema == train.schema
