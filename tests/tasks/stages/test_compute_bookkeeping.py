"""Bookkeeping is not compute (issue 43 item 11): counting what each predict batch held (the
reference model's ``_count_batch``, a library driver's ``layout``: relflow walks every field)
and scoring quality (``Quality.add``) ran inside the compute stage and inside each request's
compute step. Now the timed loop keeps references and ``EngineBase.settle`` counts them after
the compute stage (offline: right after it; a request: with the bookkeeping it runs outside
its latency).

Each bookkeeping function is made to cost known, dyadic seconds on a scripted clock (nothing
else moves it), so the compute stage's seconds say exactly how much of it ran inside; the
figures they count must be the ones an eager count of the same batches gives.
"""

from __future__ import annotations

import copy
import importlib
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch

from model.arrow import coordinate_counts
from tasks.measure.quality import Quality
from tasks.run.chain import Chain
from tasks.run.scenarios.workload import Workload
from tasks.sources.files import resolve_sources
from tasks.spec import parse_spec
from tasks.stages.write import PredictionWriter
from tests.scripted_time import ScriptedTime

os.environ.setdefault("HF_HUB_OFFLINE", "1")

LAYOUT_S = 0.125  # one batch's layout count
QUALITY_S = 0.25  # one chunk's quality scoring
BATCHES = 3  # 5 shop customers in batches of 2

# model.library -> the class and method that count one predict batch's layout
COUNTERS = {
    "reference": ("tasks.libraries.reference.engine", "Engine", "_count_batch"),
    "relational_transformers": ("tasks.libraries.relational_transformers.side", "_Steps", "layout"),
    "relflow": ("tasks.libraries.relflow.side", "_Steps", "layout"),
}


def _spec(shop_spec: dict[str, Any], library: str) -> dict[str, Any]:
    spec = copy.deepcopy(shop_spec)
    if library != "reference":
        # two blocks for RT: the lines branch is two foreign-key hops below the target
        spec["model"] = {"library": library, "d_model": 8, "layers": 2, "heads": 2}
    spec["run"] |= {"batch_size": 2, "epochs": 1, "system_metrics_interval_s": 0}
    # customer 1 held out (the key hash at 0.3), both classes among the training rows
    spec["task"]["validation_fraction"] = 0.3
    return spec


def _expected_layouts(library: str, engine: Any, tz: Any) -> tuple[list[tuple[int, int]], set[tuple[int, ...]]]:
    """Each predict batch's (present, padded) coordinates and padded shape, counted eagerly
    from the batches themselves, as the code before the change counted them."""
    rows = torch.arange(tz.root_rows)
    coords, shapes = [], set()
    if library == "reference":
        walk = engine.schema.root.walk()[1:]
        for part, _ in engine.batches(tz, rows):
            coords.append(coordinate_counts(part, engine.schema))
            shapes.add(tuple(part.nodes[n.name].present.shape[-1] for n in walk))
    elif library == "relational_transformers":
        from tasks.libraries.relational_transformers import cells_padded, cells_present

        for part, _ in engine.driver.batches(tz, rows):
            coords.append((cells_present(part.batch), cells_padded(part.batch)))
            shapes.add(tuple(part.batch.is_padding.shape))
    else:
        for part, _ in engine.driver.batches(tz, rows):
            occ = engine.driver.driver.occupancy(part.td)
            coords.append((occ.present, occ.allocated))
            shapes.add(tuple(f.allocated // max(occ.rows, 1) for f in occ.sequences.values()))
    return coords, shapes


@pytest.mark.parametrize("served", ["offline", "request"])
@pytest.mark.parametrize("library", list(COUNTERS))
def test_bookkeeping_is_counted_after_the_compute_stage_not_inside_it(
    library, served, shop_spec, shop_files, tmp_path, monkeypatch
):
    if library == "relflow":
        pytest.importorskip("lightning.pytorch")
    torch.manual_seed(0)
    spec = parse_spec(_spec(shop_spec, library))
    time = ScriptedTime()
    chain = Chain(spec, resolve_sources(spec, shop_files), torch.device("cpu"), clock=time.clock)
    work = Workload(chain)
    work.list_keys()
    work.train()  # one epoch: every library has learned its classes, so quality scores rows
    tz = work.prepare_untimed(0)
    engine = chain.engine
    assert engine is not None

    calls = {"layout": 0, "quality": 0}

    def costly(original: Callable[..., Any], what: str, seconds: float) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            calls[what] += 1
            time.t += seconds
            return original(*args, **kwargs)

        return run

    module, cls, name = COUNTERS[library]
    counter_class = getattr(importlib.import_module(module), cls)
    monkeypatch.setattr(counter_class, name, costly(getattr(counter_class, name), "layout", LAYOUT_S))
    monkeypatch.setattr(Quality, "add", costly(Quality.add, "quality", QUALITY_S))

    seconds: dict[str, float] = {}
    later: list[Callable[[], None]] | None = [] if served == "request" else None
    writer = PredictionWriter(tmp_path / "p.parquet")
    start = time.t
    outs = chain.serve(tz, writer, lambda stage, s, rows: seconds.__setitem__(stage, s), later=later)
    writer.abort()
    bookkeeping = BATCHES * LAYOUT_S + QUALITY_S
    # the compute stage (and calibrate, write) ran none of it: its seconds are the step alone
    assert seconds == {"compute": 0.0, "calibrate": 0.0, "write": 0.0}
    if later is not None:  # a request: nothing counted inside its latency span at all
        assert time.t == start and calls == {"layout": 0, "quality": 0}
        for book in later:
            book()
    # ... and all of it ran, once, outside the stages
    assert calls == {"layout": BATCHES, "quality": 1}
    assert time.t - start == bookkeeping

    # the counted figures are what an eager count of the same batches gives
    coords, shapes = _expected_layouts(library, engine, tz)
    assert len(coords) == BATCHES
    assert engine.batch_coords == coords
    assert engine.batch_shapes == shapes
    eager = engine.new_quality()
    assert outs.labels is not None and outs.label_mask is not None
    eager.add(outs.tensors["prediction"], outs.labels, outs.label_mask, tz.keys)  # temperature 1: raw logits
    assert engine.quality.metrics() == eager.metrics()
    assert engine.quality.metrics()["rows"] == 1


def test_an_untracked_pass_counts_nothing_into_the_runs_figures(shop_spec, shop_files):
    """The output check's offline pass (``untracked``) keeps its layouts and scores apart: what
    the run kept before it is still counted, nothing of the pass is."""
    spec = parse_spec(_spec(shop_spec, "reference"))
    chain = Chain(spec, resolve_sources(spec, shop_files), torch.device("cpu"))
    work = Workload(chain)
    work.list_keys()
    tz = work.prepare_untimed(0)
    engine = chain.engine
    assert engine is not None
    engine.predict(tz, ("prediction",))  # kept, not yet counted
    with engine.untracked():
        engine.predict(tz, ("prediction",))
        assert len(engine.batch_coords) == BATCHES  # the pass's own, counted on reading
    assert len(engine.batch_coords) == BATCHES  # the run's kept batches, once
    assert engine.quality.metrics()["rows"] == 1
