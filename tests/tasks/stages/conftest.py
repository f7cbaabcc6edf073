"""Helpers and the ``pre`` fixture shared by the stage tests (retrieve, preprocess, tensorize, write).

The hand-made shop workload (tables in tests/conftest.py):
customers (root) -> orders (max_length 2, by o_date) -> lines (max_length 3, by l_no):
customer 1 has 3 orders (10, 11, 12), customer 3 none; order 10 has 4 lines, order 12 two.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from tasks.spec import Spec, parse_spec
from tasks.stages.preprocess import Preprocessed, preprocess
from tasks.stages.retrieve import ROOT, Retrieved


def spec_of(raw: dict) -> Spec:
    return parse_spec(raw, "(test)")


def orders_branch(raw: dict) -> dict:
    return raw["schema"]["branches"][0]


def lines_branch(raw: dict) -> dict:
    return raw["schema"]["branches"][0]["branches"][0]


def retrieved_of(tables: dict[str, pa.Table]) -> Retrieved:
    """The whole shop as one chunk, straight from memory (no files)."""
    return Retrieved(
        {ROOT: tables["customers"], "orders": tables["orders"], "lines": tables["lines"]},
        bytes_read=0,
        root_rows=tables["customers"].num_rows,
    )


@pytest.fixture
def pre(shop_spec, shop_tables) -> Preprocessed:
    return preprocess(spec_of(shop_spec), retrieved_of(shop_tables))
