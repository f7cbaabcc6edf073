"""Stage 5, write: the selected outputs, one row per root key, to Parquet, atomically.

Outputs of branch rows become list columns holding only present rows (nested lists for
deeper branches), built from the presence masks with one offsets computation per level.
Chunks append row groups to a temporary file next to the target; ``commit`` renames it
into place, ``abort`` deletes it, so a failed run leaves no half-written predictions.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from model.arrow import Encoding
from model.schema import ModelSchema
from tasks.spec import Spec
from tasks.stages.engine import PredictOutputs


def _leaf_array(values: np.ndarray) -> pa.Array:
    """[n] -> plain array; [n, D] -> fixed_size_list<D>."""
    if values.ndim == 1:
        return pa.array(values)
    width = values.shape[1]  # the outer list; deeper dims nest inside it
    inner = _leaf_array(values.reshape(-1, *values.shape[2:])) if values.ndim > 2 else pa.array(values.reshape(-1))
    return pa.FixedSizeListArray.from_arrays(inner, width)


def nest(values: np.ndarray | pa.Array, masks: list[np.ndarray]) -> pa.Array:
    """Present entries of ``[B, L1..Ld, ...]`` as a length-B nested list array.

    ``values`` already holds only the present entries in row-major order (``x[mask_d]``),
    either as numpy (trailing dims become fixed-size lists) or as an Arrow array.
    ``masks[k]`` is the presence mask of level k+1, shape ``[B, L1..Lk+1]``.
    """
    arr = values if isinstance(values, pa.Array) else _leaf_array(values)
    for k in range(len(masks) - 1, -1, -1):
        counts = masks[k].sum(axis=-1)
        if k > 0:
            counts = counts[masks[k - 1]]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        arr = pa.ListArray.from_arrays(pa.array(offsets), arr)
    return arr


def _present(values: torch.Tensor, masks: list[np.ndarray]) -> np.ndarray:
    v = values.numpy()
    return v[masks[-1]] if masks else v


def to_table(spec: Spec, schema: ModelSchema, enc: Encoding, keys: pa.Array, out: PredictOutputs) -> pa.Table:
    cols: dict[str, pa.Array] = {spec.schema_.root.key: keys}

    def masks(node: str) -> list[np.ndarray]:
        return [out.present[n.name].numpy() for n in schema.path(node)[1:]]

    target = schema.target
    tmask = masks(target.node)
    pred = out.tensors["prediction"]
    for name in spec.task.outputs:
        head, _, arg = name.partition(":")
        if head == "prediction":
            flat = _present(pred, tmask)
            if target.kind == "category":
                labels = pa.array(enc.classes, pa.string()).take(pa.array(flat.argmax(-1)))
                cols["prediction"] = nest(labels, tmask)
            elif target.kind == "binary":
                # float64: calibrated logits near 0 (a large temperature) tie as float32 sigmoids
                cols["prediction"] = nest(1.0 / (1.0 + np.exp(-flat.astype(np.float64))), tmask)
            else:
                cols["prediction"] = nest(flat * enc.target_std + enc.target_mean, tmask)
        elif head == "topk":
            k = min(int(arg), pred.shape[-1])
            probs = torch.softmax(pred, dim=-1)
            scores, idx = probs.topk(k, dim=-1)
            flat_idx = _present(idx, tmask)
            labels = pa.array(enc.classes, pa.string()).take(pa.array(flat_idx.reshape(-1)))
            cols[f"top{k}_labels"] = nest(pa.FixedSizeListArray.from_arrays(labels, k), tmask)
            cols[f"top{k}_scores"] = nest(_present(scores, tmask), tmask)
        elif head == "root_embedding":
            cols["root_embedding"] = nest(out.tensors[name].numpy(), [])
        elif head == "branch_embedding":
            parent = schema.path(arg)[-2].name
            m = masks(parent)
            cols[f"branch_embedding_{arg}"] = nest(_present(out.tensors[name], m), m)
        elif head == "leaf":
            m = masks(arg)
            cols[f"leaf_{arg}"] = nest(_present(out.tensors[name], m), m)
    return pa.table(cols)


class PredictionWriter:
    """Append chunks to ``<path>.tmp-<pid>``; ``commit`` renames it to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        self._writer: pq.ParquetWriter | None = None
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self.tmp, table.schema, compression="zstd")
        self._writer.write_table(table)
        self.rows += table.num_rows

    def commit(self) -> int:
        """Finish the file atomically; returns its size in bytes."""
        if self._writer is None:
            raise RuntimeError("no predictions were written")
        self._writer.close()
        self._writer = None
        os.replace(self.tmp, self.path)
        return self.path.stat().st_size

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self.tmp.unlink(missing_ok=True)
