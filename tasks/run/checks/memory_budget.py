"""Memory of one chunk, estimated from metadata before any work, against a budget.

Reserved lengths multiply: ``lineitem.max_length=100000`` reserves 100000 rows per order
whatever the data holds, and the padded tensors of a chunk grew past 12 GB before anything
failed. Two rules:

1. Never reserve more rows than the data has: each branch reserves
   ``min(max_length, observed maximum rows per parent row)`` (at least 1); both figures are
   logged (``data.observed_max_rows.<branch>``, ``data.reserved_rows.<branch>``) and
   ``max_length`` stays in the params. A checkpoint's lengths are kept in predict mode
   (its row-position embeddings have that size).
2. Refuse (exit 2) when the estimate exceeds ``run.max_memory_bytes`` (default: half of the
   memory available when the run starts), naming the estimate, the budget and the keys
   that lower it.

The estimate (``memory.estimated_chunk_bytes``) is deliberately simple and errs high:
- encoded tensors of a chunk (``chunk rows x reserved rows per root x bytes per row``, the
  row bytes from ``model/batch.py``: presence 1, each continuous cell 4 + 1 null flag, each
  category cell 8, the target 9), doubled for the NumPy temporaries of encoding;
- activations of one batch: ``batch_size x reserved cells per root x d_model x 4 bytes x
  layers x 16`` (attention projections, feed-forward, backward in training);
- attention scores of one batch: for each branch ``batch_size x parent rows x heads x
  length^2 x 4 bytes`` per layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import psutil

from tasks.backends.lengths import reserved_length
from tasks.runtime.errors import UserError
from tasks.spec import Branch, Spec

DEFAULT_SHARE = 0.5  # of the memory available at start, when run.max_memory_bytes is unset
ACTIVATION_FACTOR = 16
ENCODE_TEMPORARIES = 2


@dataclass(frozen=True)
class Estimate:
    chunk_bytes: int
    budget_bytes: int
    reserved_rows: dict[str, int]  # branch -> rows reserved per parent row


def reserved_lengths(
    spec: Spec, observed: dict[str, int], checkpoint_lengths: dict[str, int] | None = None
) -> dict[str, int]:
    """Rows each branch reserves per parent: a saved model's where it fits, else the data's
    maximum, capped by max_length (the one rule: tasks/backends/lengths.py)."""
    saved = checkpoint_lengths or {}
    return {
        b.name: reserved_length(b.max_length, saved.get(b.name), observed.get(b.name)) for b, _ in spec.schema_.walk()
    }


def _row_bytes(cols: Mapping[str, str], has_target: bool, text_dim: int) -> tuple[int, int]:
    """(bytes per encoded row, cells per row) of one node; a text cell is its encoder's
    ``text_dim`` float32 vector."""
    text = sum(1 for k in cols.values() if k == "text")
    cont = sum(1 for k in cols.values() if k not in ("category", "text")) + (1 if has_target else 0)
    cat = sum(1 for k in cols.values() if k == "category")
    return 1 + cont * 5 + cat * 8 + text * (text_dim * 4 + 1) + (9 if has_target else 0), cont + cat + text


def estimate(spec: Spec, root_rows: int, lengths: dict[str, int]) -> Estimate:
    target_node = spec.task.branch
    row_b, cells = _row_bytes(spec.schema_.root.columns, target_node is None, spec.run.text.dim)
    enc_bytes, cells_per_root, attention = row_b, cells, 0
    batch = spec.run.batch_size

    def visit(branches: list[Branch], rows_above: int) -> None:
        nonlocal enc_bytes, cells_per_root, attention
        for b in branches:
            n = lengths[b.name]
            rows = rows_above * n
            rb, c = _row_bytes(b.columns, target_node == b.name, spec.run.text.dim)
            enc_bytes += rows * rb
            cells_per_root += rows * c
            attention += batch * rows_above * spec.model.heads * n * n * 4
            visit(b.branches, rows)

    visit(spec.schema_.branches, 1)
    chunk = min(spec.run.chunk_rows, max(root_rows, 1))
    total = (
        chunk * enc_bytes * ENCODE_TEMPORARIES
        + batch * cells_per_root * spec.model.d_model * 4 * spec.model.layers * ACTIVATION_FACTOR
        + attention * spec.model.layers
    )
    return Estimate(int(total), budget(spec), lengths)


def budget(spec: Spec) -> int:
    limit = getattr(spec.run, "max_memory_bytes", None)
    return int(limit) if limit else int(psutil.virtual_memory().available * DEFAULT_SHARE)


def check(spec: Spec, est: Estimate) -> None:
    if est.chunk_bytes <= est.budget_bytes:
        return
    source = (
        "run.max_memory_bytes"
        if getattr(spec.run, "max_memory_bytes", None)
        else f"{DEFAULT_SHARE:.0%} of the available memory; set run.max_memory_bytes"
    )
    lengths = ", ".join(f"{b}.max_length (reserving {n})" for b, n in est.reserved_rows.items())
    raise UserError(
        f"One chunk would need about {_human(est.chunk_bytes)} but the memory budget is "
        f"{_human(est.budget_bytes)} ({source}). Lower run.chunk_rows (now {spec.run.chunk_rows}), run.batch_size "
        f"(now {spec.run.batch_size}) or a branch's max_length ({lengths}), or raise "
        "run.max_memory_bytes."
    )


def _human(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB ({n:,} bytes)" if n >= 2**30 else f"{n:,} bytes"
