"""The reference model's ``ModelSide`` (tasks/libraries/base.py): the harness's own steps.

encode: the harness's text encoder (tasks/stages/encode.py); tensorize: the encoding and schema
from the starting weights, else fitted on the first chunk, then padded tensors
(tasks/stages/tensorize.py); engine: ``Engine`` (engine.py) once the schema is known."""

from __future__ import annotations

import torch

from model.arrow import Encoding
from model.schema import ModelSchema
from tasks.libraries.base import Weights
from tasks.libraries.reference.engine import Engine
from tasks.measure.clock import Clock
from tasks.spec import Spec
from tasks.stages.encode import Encoded, encode, text_columns
from tasks.stages.preprocess import Preprocessed
from tasks.stages.tensorize import Chunk, fit, tensorize


class ReferenceSide:
    reuses_chunks = True  # its tensors depend on the chunk only, not on what was learnt

    def __init__(self, spec: Spec, device: torch.device, weights: Weights) -> None:
        self.spec, self.device, self.weights = spec, device, weights
        self.encoding, self.schema = weights.encoding, weights.schema
        self.encodes = bool(text_columns(spec))
        self.built: Engine | None = None

    def encode(self, pre: Preprocessed, train: bool) -> Encoded:
        return encode(self.spec, pre)

    def tensorize(self, pre: Preprocessed, train: bool, encoded: Encoded | None) -> Chunk:
        if self.encoding is None or self.schema is None:  # no checkpoint: fit on this chunk
            self.encoding, self.schema = fit(self.spec, pre)
        return tensorize(self.spec, pre, self.encoding, self.schema)

    def engine(self, clock: Clock) -> Engine | None:
        if self.schema is None:
            return None
        w = self.weights
        self.built = Engine(
            self.spec, self.schema, self.device, w.model, clock, self.encoding, optimizer_state=w.optimizer
        )
        return self.built

    def reference_inputs(self) -> tuple[Encoding, ModelSchema] | None:
        return None if self.encoding is None or self.schema is None else (self.encoding, self.schema)

    def reference_engine(self) -> Engine | None:
        return self.built
