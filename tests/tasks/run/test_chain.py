"""The one stage chain: every step in order, each second in its own named bucket (checked with
a scripted clock), text encoded on every path, and the request path equal to the offline one."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
import torch

from tasks.measure.clock import Clock
from tasks.run.chain import Chain
from tasks.run.scenarios.request import RequestPath
from tasks.run.scenarios.workload import Workload
from tasks.sources.files import resolve_sources
from tasks.spec import parse_spec
from tasks.stages.retrieve import list_root_keys
from tasks.stages.write import PredictionWriter


@pytest.fixture
def text_shop(shop_spec, shop_tables, write_tables):
    """The shop workload with a text column at the root and one in the nested lines."""
    t = dict(shop_tables)
    t["customers"] = t["customers"].append_column("c_note", pa.array(["loyal", "", None, "new", "late payer"]))
    notes = ["fragile", None, "", "ok", "quick", "slow", "x", "", "fine", None, "orphan"]
    t["lines"] = t["lines"].append_column("l_note", pa.array(notes[: t["lines"].num_rows]))
    spec = copy.deepcopy(shop_spec)
    spec["schema"]["root"]["columns"]["c_note"] = "text"
    spec["schema"]["branches"][0]["branches"][0]["columns"]["l_note"] = "text"
    spec["run"]["text"] = {"dim": 8}
    return parse_spec(spec), write_tables(t)


ORDER = ["retrieve", "preprocess", "encode", "tensorize", "compute", "calibrate", "write"]


def scripted_runner(seen: list[str]) -> Callable[..., Any]:
    """Runs each step and reports a known duration for it: stage i lasts 2**i seconds, so a
    second charged to the wrong bucket (or twice, or not at all) changes the sums."""

    def run(stage: str, step: Callable[[], Any], clock: Clock) -> tuple[Any, float]:
        seen.append(stage)
        return step(), float(2 ** ORDER.index(stage))

    return run


def test_every_step_runs_in_order_through_the_runner_and_its_seconds_land_in_its_bucket(text_shop, tmp_path):
    spec, folder = text_shop
    sources = resolve_sources(spec, folder)
    seen: list[str] = []
    chain = Chain(spec, sources, torch.device("cpu"), run_stage=scripted_runner(seen))
    keys, _ = list_root_keys(spec, sources)
    book: dict[str, tuple[float, int]] = {}
    p = chain.prepare(keys, lambda stage, s, rows: book.__setitem__(stage, (s, rows)))
    writer = PredictionWriter(tmp_path / "p.parquet")
    chain.serve(p.tz, writer, lambda stage, s, rows: book.__setitem__(stage, (s, rows)))
    assert seen == ORDER
    assert book == {stage: (float(2**i), 5) for i, stage in enumerate(ORDER)}  # 5 root rows each
    assert p.encoded > 0 and p.encode_unit == "cells" and writer.rows == 5
    writer.abort()


def test_request_path_encodes_text_and_serves_what_the_offline_chain_serves(text_shop, tmp_path):
    spec, folder = text_shop
    sources = resolve_sources(spec, folder)
    work = Workload(Chain(spec, sources, torch.device("cpu")))
    work.list_keys()
    offline = work.prepare(0, "predict")
    request = RequestPath(work, PredictionWriter(tmp_path / "r.parquet"))
    keys = work.chunks[0][:2]
    steps = request(keys)
    request.settle()  # what the call counts, outside its timing
    assert list(steps) == ORDER
    assert work.stages["predict"]["encode"].rows == 5 + 2  # the chunk, then the request
    # the request's tensors are the offline chunk's rows for the same keys
    alone = work.chain.prepare_untimed(keys)
    root = alone.batch.nodes["root"]
    torch.testing.assert_close(root.text, offline.batch.nodes["root"].text[:2])
    request.writer.abort()
