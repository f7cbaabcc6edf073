"""The engine counts the steady predict batches' root rows by present shape (what
``compute.mfu`` counts FLOPs over): each root row at its branches' longest present instance."""

from __future__ import annotations

from collections import Counter

import torch

from model import bucketing
from tasks.stages.compute import Engine


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
