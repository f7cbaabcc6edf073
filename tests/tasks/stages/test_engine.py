"""The engine counts the steady predict batches' root rows by present shape (what
``compute.mfu`` counts FLOPs over): each root row at its branches' longest present instance."""

from __future__ import annotations

from collections import Counter

import torch

from model import bucketing
from tasks.libraries.reference.engine import Engine
from tasks.measure.clock import Clock


def test_steady_batches_are_counted_at_each_root_rows_present_shape(shop_spec, shop_files, prepare_chunk):
    shop_spec["run"]["batch_size"] = 1  # five batches: the first call, then four steady ones
    spec, enc, schema, tz = prepare_chunk(shop_spec, shop_files)
    engine = Engine(spec, schema, torch.device("cpu"), encoding=enc)
    engine.predict(tz, ("prediction",))
    shapes = bucketing.root_shapes(tz.batch, schema)
    names = [n.name for n in schema.root.walk()[1:]]
    expected = Counter(tuple(int(shapes.lengths[n][i]) for n in names) for i in range(1, tz.root_rows))
    assert engine.steady_shapes["predict"] == expected
    assert sum(expected.values()) == 4 and len(expected) > 1  # the rows really differ in shape
    assert engine.steady_shapes["train"] == Counter()


def test_counting_the_shapes_costs_the_timed_predict_nothing(shop_spec, shop_files, prepare_chunk, monkeypatch):
    """The count (a stack and unique per steady batch) runs when the figure is read, after the
    timed region, not inside predict's wall (compute seconds, e2e, each request's latency).
    A scripted clock that only moves when ``torch.unique`` runs: 1 s per call. The old code
    counted inside the wall: wall 4.0 s for the four steady batches."""
    shop_spec["run"]["batch_size"] = 1
    shop_spec["run"]["packing"] = "off"  # packed attention groups its rows with torch.unique too
    spec, enc, schema, tz = prepare_chunk(shop_spec, shop_files)
    now = [0.0]
    real_unique = torch.unique

    def unique_taking_a_second(*args, **kwargs):
        now[0] += 1.0
        return real_unique(*args, **kwargs)

    monkeypatch.setattr(torch, "unique", unique_taking_a_second)
    engine = Engine(spec, schema, torch.device("cpu"), clock=Clock("cpu", now=lambda: now[0]), encoding=enc)
    engine.predict(tz, ("prediction",))
    assert engine.wall_seconds == 0.0
    assert engine.predict_timings.steady_seconds == [0.0] * 4
    shapes = bucketing.root_shapes(tz.batch, schema)
    names = [n.name for n in schema.root.walk()[1:]]
    expected = Counter(tuple(int(shapes.lengths[n][i]) for n in names) for i in range(1, tz.root_rows))
    assert engine.steady_shapes["predict"] == expected  # counted now, once per steady batch
    assert now[0] == 4.0
    assert engine.steady_shapes["predict"] == expected  # read again: not counted twice
