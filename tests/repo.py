"""What many tests share: the repository root, and the spec overrides that make a run tiny.

Each test file builds its own override list from these pieces plus what it is about, so a
change to "a tiny model" or "any steady batch counts" is made once."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SPEC = REPO / "benchmarks" / "tpch_orders.yaml"

TINY_MODEL = ["model.d_model=8", "model.heads=2", "model.layers=1"]  # the smallest the spec allows
SMALL_MODEL = ["model.d_model=16", "model.layers=1", "model.heads=2"]  # small but not degenerate
# Validity rules a few-second run cannot meet (tests about other things): one steady batch counts.
ANY_STEADY = ["run.min_steady_batches=1", "run.min_steady_seconds=0.000001"]
NO_SYSTEM_METRICS = ["run.system_metrics_interval_s=0"]  # no sampler thread in short runs
# One CPU epoch in batches of 512: a train+predict run of the small model in a few seconds.
ONE_EPOCH = ["run.epochs=1", "run.batch_size=512", "run.device=cpu"]
# Few, short rows: big batches of orders cut to two line items (predict runs of the tiny model).
FEW_SHORT_BATCHES = ["run.batch_size=2048", "lineitem.max_length=2"]

# The two runs the flow and CLI tests share; a test adds only what it is about (issue 42 item 5).
# A small run: the small model's train+predict, one CPU epoch in batches of 512, in a few seconds.
SMALL_RUN = [*SMALL_MODEL, *ONE_EPOCH]
# A tiny run: the tiny model on few, short rows in big batches (servers, schedules, many processes).
TINY_RUN = [*TINY_MODEL, *FEW_SHORT_BATCHES]


def as_cli(overrides: list[str]) -> list[str]:
    """``["k=v", ...]`` as ``--set`` arguments of ``relflow-bench run``."""
    return [arg for o in overrides for arg in ("--set", o)]
