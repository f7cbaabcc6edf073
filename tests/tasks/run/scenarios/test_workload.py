"""One meaning per key for what an encode step counts, and for the reserved layout (issue 43
item 8): the reference model's text encoder turns each text cell into a vector and logs
``data.text_cells`` / ``encode.cells_per_s``; relational-transformers' encode step turns each
distinct string and column name of a chunk into one (its cells gather them), so it logs
``data.strings_encoded`` / ``encode.strings_per_s`` and never the cells keys. RT pads each
batch to its own longest context, so it has no reserved layout: no ``data.coords_reserved``
or ``data.occupancy`` (its padding is compute's ``data.padded_coords``).

Through the chain and the workload's accounting (what ``collect`` logs), one chunk each.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import torch

from tasks.measure import keys as K
from tasks.measure.records import RunResult
from tasks.run.chain import Chain
from tasks.run.scenarios.workload import Workload
from tasks.sources.files import resolve_sources
from tasks.spec import parse_spec

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CELLS_KEYS = {K.DATA_TEXT_CELLS, K.ENCODE_CELLS_PER_S}
STRINGS_KEYS = {K.DATA_STRINGS_ENCODED, K.ENCODE_STRINGS_PER_S}
RESERVED_KEYS = {K.DATA_COORDS_RESERVED, K.DATA_OCCUPANCY}


def _one_pass(spec_dict: dict[str, Any], folder: Path) -> tuple[dict[str, float], Any]:
    """Every root key as one chunk through one predict pass's prepare steps and their
    accounting; the metrics those figures give (the region's ``work.data_report()``)."""
    spec = parse_spec(spec_dict)
    chain = Chain(spec, resolve_sources(spec, folder), torch.device("cpu"))
    work = Workload(chain)
    work.list_keys()
    assert len(work.chunks) == 1
    tz = work.prepare(0, "predict")
    return RunResult(data=work.data_report()).metrics(), tz


def test_relational_transformers_counts_strings_under_keys_of_their_own(shop_spec, shop_files):
    spec = copy.deepcopy(shop_spec)
    spec["model"] = {"library": "relational_transformers", "d_model": 8, "layers": 2, "heads": 2}
    spec["run"] |= {"batch_size": 2, "system_metrics_interval_s": 0}
    m, tz = _one_pass(spec, shop_files)
    contexts = tz.inputs.encoding.contexts
    # each distinct category/text value once, and each (table, column) name once
    distinct = len(pc.unique(contexts.strings))
    assert distinct == len(contexts.strings)
    strings = distinct + len(contexts.column_names)
    assert m[K.DATA_STRINGS_ENCODED] == strings
    assert m[K.ENCODE_STRINGS_PER_S] > 0
    # the cells those strings fill are far more: a cells key would have said 'strings' of them
    assert m[K.DATA_COORDS_PRESENT] == tz.coords_present > strings
    assert not (CELLS_KEYS | RESERVED_KEYS) & set(m), sorted((CELLS_KEYS | RESERVED_KEYS) & set(m))


def test_the_reference_text_encoder_keeps_counting_cells(shop_spec, shop_tables, write_tables):
    t = dict(shop_tables)
    t["customers"] = t["customers"].append_column("c_note", pa.array(["loyal", "", None, "new", "late payer"]))
    notes = ["fragile", None, "", "ok", "quick", "slow", "x", "", "fine", None, "orphan"]
    t["lines"] = t["lines"].append_column("l_note", pa.array(notes[: t["lines"].num_rows]))
    spec = copy.deepcopy(shop_spec)
    spec["schema"]["root"]["columns"]["c_note"] = "text"
    spec["schema"]["branches"][0]["branches"][0]["columns"]["l_note"] = "text"
    spec["run"]["text"] = {"dim": 8}
    m, tz = _one_pass(spec, write_tables(t))
    # one per customer (the null one too: a present null cell) and one per line row kept
    lines = int(tz.batch.nodes["lines"].present.sum())
    assert m[K.DATA_TEXT_CELLS] == 5 + lines
    assert m[K.ENCODE_CELLS_PER_S] > 0
    assert not STRINGS_KEYS & set(m)
    assert m[K.DATA_OCCUPANCY] == m[K.DATA_COORDS_PRESENT] / m[K.DATA_COORDS_RESERVED]


def test_the_data_report_counts_each_chunk_once_and_every_read(shop_spec, shop_files):
    """Two predict passes over 3 chunks (5 customers, 2 a chunk), then one request of 2 keys:
    the layout (coordinates, overflow) of each chunk counts once, every read (bytes, rows)
    every time, and only the request's root rows are served."""
    shop_spec["run"]["chunk_rows"] = 2
    spec = parse_spec(shop_spec)
    work = Workload(Chain(spec, resolve_sources(spec, shop_files), torch.device("cpu")))
    work.list_keys()
    listing = work.data.bytes_read  # the key listing's read
    chunks = [work.chain.prepare_untimed(keys) for keys in work.chunks]
    reads = [work.chain.prepare(keys, lambda *_: None) for keys in work.chunks]  # what each prepare reads
    for _ in range(2):
        for i in range(3):
            work.prepare(i, "predict")
    request = work.chain.prepare(work.chunks[0], lambda *_: None)
    work.account(request, None)
    d = work.data_report()
    assert (d.root_rows, d.chunks, d.rows_served, d.encode) == (5, 3, 2, None)
    assert d.coords_present == sum(tz.coords_present for tz in chunks) + request.tz.coords_present
    assert d.coords_reserved == sum(tz.coords_reserved or 0 for tz in chunks) + (request.tz.coords_reserved or 0)
    assert d.bytes_read == listing + 2 * sum(p.bytes_read for p in reads) + request.bytes_read
    assert d.rows_read == 2 * sum(p.rows_read for p in reads) + request.rows_read
    dropped = [p.overflow_dropped for p in (*reads, request)]
    assert d.overflow_dropped == {n: sum(o.get(n, 0) for o in dropped) for n in {n for o in dropped for n in o}}
