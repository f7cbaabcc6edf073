"""Stage 3, tensorize: nested Arrow rows -> padded model tensors.

The vectorised conversion lives in ``model.arrow`` (the model's data module uses the same
code); this stage adds the harness's bookkeeping: fitting the encoding on the training
split when no checkpoint provides one, and counting present vs reserved coordinates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Protocol

import pyarrow as pa
import torch

from model.arrow import (
    Encoding,
    NodeLayout,
    arrow_coordinate_counts,
    coordinate_counts,
    encode,
    fit_encoding,
    flatten,
    model_schema,
)
from model.batch import Batch
from model.bucketing import RootShapes, arrow_root_shapes, root_shapes
from model.schema import ModelSchema, TargetDef
from tasks.spec import Branch, Spec
from tasks.stages.preprocess import TRAIN, Preprocessed
from tasks.stages.retrieve import ROOT
from tasks.stages.split import role_masks


class Chunk(Protocol):
    """What the tensorize stage hands compute, for any model under test (tasks/libraries):
    the root keys and split of a chunk's rows, and how many coordinates (cells) it holds."""

    keys: pa.Array  # root keys, aligned with the rows
    is_train: torch.Tensor  # bool [B]
    is_fit: torch.Tensor  # bool [B]: held out, fits the output calibration (tasks/stages/split.py)
    is_scored: torch.Tensor  # bool [B]: held out, scored (quality.*)
    coords_present: int
    root_rows: int

    @property
    def coords_reserved(self) -> int | None:
        """Coordinates the model's reserved layout has room for; None for a model with no
        reserved layout (relational-transformers pads each batch to its own longest context,
        so its padded cells are compute's ``data.padded_coords``, not a reservation)."""
        ...

    @property
    def tensorized_rows(self) -> int:
        """Root rows this step turned into tensors (its stage row's rows): every row of the
        chunk, or only its training rows where a library encodes those alone to train."""
        ...

    @property
    def produced_bytes(self) -> int: ...

    def tensors(self) -> list[torch.Tensor]: ...


@dataclass
class Tensorized:
    """A chunk ready for compute: encoded in-process (``batch``) or, when loader workers
    encode batch by batch (``run.loader.num_workers > 0``), the Arrow rows (``table``)."""

    batch: Batch | None  # every root row of the chunk (None in loader mode)
    keys: pa.Array  # root keys, aligned with the batch
    is_train: torch.Tensor  # bool [B]
    is_fit: torch.Tensor  # bool [B]
    is_scored: torch.Tensor  # bool [B]
    coords_present: int
    coords_reserved: int
    root_rows: int
    table: pa.Table | None = None  # loader mode: nested Arrow rows, encoded by the workers
    shapes: RootShapes | None = None  # run.bucketing by_length: context size per root row

    def tensors(self) -> list[torch.Tensor]:
        """What this step produced, as tensors (loader mode: the Arrow rows' buffers as one
        byte tensor, since the workers build the tensors later)."""
        if self.batch is None:
            assert self.table is not None
            return [torch.empty(self.table.nbytes, dtype=torch.uint8)]
        b = self.batch
        out = [b.labels, b.label_present]
        for node in b.nodes.values():
            out += [getattr(node, f.name) for f in fields(node) if isinstance(getattr(node, f.name), torch.Tensor)]
        return out

    @property
    def tensorized_rows(self) -> int:
        return self.root_rows  # the reference model tensorizes every row of the chunk

    @property
    def produced_bytes(self) -> int:
        """Bytes of the tensors this step produced (the tensorize floor's memcpy size)."""
        if self.batch is None:
            assert self.table is not None
            return int(self.table.nbytes)
        return sum(t.nbytes for t in self.tensors())


def layout(spec: Spec) -> NodeLayout:
    """The spec's schema tree as the model's Arrow layout (target column included)."""

    def columns(node: str, cols: Mapping[str, str]) -> dict[str, str]:
        out = dict(cols)
        if (spec.task.branch or ROOT) == node:
            out[spec.task.target] = "numeric"  # masked target cell; kind is irrelevant
        return out

    def branch(b: Branch) -> NodeLayout:
        return NodeLayout(
            b.name, columns(b.name, b.columns), b.max_length, b.reduce, tuple(branch(c) for c in b.branches)
        )

    root = spec.schema_.root
    return NodeLayout(ROOT, columns(ROOT, root.columns), 1, "mean", tuple(branch(b) for b in spec.schema_.branches))


def target(spec: Spec) -> TargetDef:
    return TargetDef(spec.task.branch or ROOT, spec.task.target, spec.task.kind)


def fit(spec: Spec, pre: Preprocessed) -> tuple[Encoding, ModelSchema]:
    """Fit vocabularies and standardisation on the chunk's training rows."""
    lay = layout(spec)
    train = pre.table.filter(pre.table[TRAIN])
    enc = fit_encoding(train if train.num_rows else pre.table, lay, target(spec))
    return enc, model_schema(lay, target(spec), enc)


def tensorize(spec: Spec, pre: Preprocessed, enc: Encoding, schema: ModelSchema) -> Tensorized:
    if spec.run.loader.num_workers > 0:
        # Loader workers encode each batch; here only the (offset-only) coordinate counts.
        batch = None
        present, reserved = arrow_coordinate_counts(pre.table, schema, layout(spec))
    else:
        batch = encode(pre.table, schema, layout(spec), enc)
        present, reserved = coordinate_counts(batch, schema)
    train, fit, scored = role_masks(pre.table)
    shapes = None
    if spec.run.bucketing == "by_length":  # per-root sizes the compute stage groups batches by
        shapes = (
            root_shapes(batch, schema)
            if batch is not None
            else arrow_root_shapes(flatten(pre.table, layout(spec)), schema, pre.table.num_rows)
        )
    return Tensorized(
        batch=batch,
        keys=pre.table[spec.schema_.root.key].combine_chunks(),
        is_train=torch.from_numpy(train),
        is_fit=torch.from_numpy(fit),
        is_scored=torch.from_numpy(scored),
        coords_present=present,
        coords_reserved=reserved,
        root_rows=pre.root_rows,
        table=pre.table if batch is None else None,
        shapes=shapes,
    )
