"""Fixtures of the scenario tests."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest


def repeated_shop(tables: dict[str, pa.Table], copies: int) -> dict[str, pa.Table]:
    """The shop tables ``copies`` times over, keys shifted per copy (both classes in training)."""
    keys = {"customers": ("c_id",), "orders": ("o_id", "o_cust"), "lines": ("l_order",)}
    out = {}
    for name, table in tables.items():
        parts = []
        for k in range(copies):
            t = table
            for col in keys[name]:
                i = t.schema.get_field_index(col)
                t = t.set_column(i, col, pc.add(t[col], 1000 * k))
            parts.append(t)
        out[name] = pa.concat_tables(parts)
    return out


@pytest.fixture
def many_shop_files(shop_tables, write_tables) -> Path:
    """The shop tables eight times over (40 customers): both classes among the training rows
    and enough held-out rows to fit on and to draw requests from."""
    return write_tables(repeated_shop(shop_tables, 8))


@pytest.fixture(scope="module")
def many_shop_folder(shop_kit, tmp_path_factory) -> Path:
    """``many_shop_files`` once per module, for module-scoped trained engines."""
    folder = tmp_path_factory.mktemp("many_shop")
    for name, table in repeated_shop(shop_kit.tables(), 8).items():
        shop_kit.write_table(table, folder / f"{name}.parquet")
    return folder
