"""ArrowDataModule: pyarrow Tables in, encoded ``Batch`` objects on the model's device out.

Design choices:
- Arrow data (and anything the loader retains) stays on the CPU; only encoded tensors move
  to the model's device (``non_blocking`` when pinned).
- Batches are contiguous row ranges of ``batch_size`` rows (the last one may be partial).
  With ``num_workers > 0`` every worker holds the whole table (it "reads" it) and then
  takes a disjoint subset of batches: batch ``i`` belongs to worker ``i % num_workers``.
  The DataLoader visits workers round-robin, so batches still arrive in row order.
- Encoding runs in the worker (``encode(table_slice) -> Batch``); pass ``encode`` (must be
  picklable for workers, e.g. a module-level function or ``functools.partial``), or pass
  ``layout`` and ``encoding`` (a fitted ``model.arrow.Encoding``) to use
  ``model.arrow.encode(table, model.schema, layout, encoding)``.
- Loader settings that cannot apply are ignored with a warning: ``persistent_workers`` and
  ``prefetch_factor`` without workers, ``pin_memory`` when the model is not on CUDA.
- Batch order is not shuffled (a shuffle belongs to the preprocess stage).
- ``stream(parts)`` feeds already-cut Arrow slices (any order, any table) through one
  DataLoader built once per data module: the slices travel to the workers through the
  loader's index queue and workers only encode, so ``persistent_workers=True`` keeps the
  same workers across chunks, epochs and passes.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, get_worker_info

from .batch import Batch
from .schema import ModelSchema

Encode = Callable[[pa.Table], Batch]


class ArrowBatches(IterableDataset[Batch]):
    """Encoded batches over contiguous row ranges; workers take disjoint batch subsets."""

    def __init__(self, table: pa.Table, batch_size: int, encode: Encode) -> None:
        super().__init__()
        self.table = table
        self.batch_size = batch_size
        self.encode = encode

    def __len__(self) -> int:
        return int(math.ceil(self.table.num_rows / self.batch_size))

    def ranges(self, worker: int = 0, workers: int = 1) -> list[tuple[int, int]]:
        """``(offset, length)`` of this worker's batches."""
        n = self.table.num_rows
        return [
            (start, min(self.batch_size, n - start))
            for i, start in enumerate(range(0, n, self.batch_size))
            if i % workers == worker
        ]

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for offset, length in self.ranges(worker, workers):
            yield self.encode(self.table.slice(offset, length))


class EncodeSlices(Dataset[Batch]):
    """Map-style dataset whose "index" is the Arrow slice itself: workers only encode."""

    def __init__(self, encode: Encode) -> None:
        self.encode = encode

    def __getitem__(self, part: pa.Table) -> Batch:
        return self.encode(part)


class SliceFeed(Sampler[pa.Table]):
    """The slices of the next iteration; each iteration consumes what was fed."""

    def __init__(self) -> None:
        self.parts: Iterator[pa.Table] = iter(())
        self.count = 0

    def __iter__(self) -> Iterator[pa.Table]:
        # The same iterator however often the DataLoader asks (it calls iter() twice when
        # it builds a worker iterator); ``stream`` sets a fresh one per iteration.
        return self.parts

    def __len__(self) -> int:
        return self.count


class DeviceLoader:
    """Iterates a DataLoader and moves each batch to the model's current device."""

    def __init__(self, loader: DataLoader[Batch], model: torch.nn.Module) -> None:
        self.loader = loader
        self.model = model

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Batch]:
        device = next(self.model.parameters()).device
        non_blocking = bool(self.loader.pin_memory) and device.type == "cuda"
        for batch in self.loader:
            yield batch.to(device, non_blocking=non_blocking)


class ArrowDataModule:
    def __init__(
        self,
        model: torch.nn.Module,
        train: pa.Table | None = None,
        validate: pa.Table | None = None,
        batch_size: int | None = None,
        num_workers: int = 0,
        persistent_workers: bool = False,
        pin_memory: bool = False,
        prefetch_factor: int | None = 2,
        encode: Encode | None = None,
        encoding: Any = None,
        layout: Any = None,
    ) -> None:
        batch_size = batch_size if batch_size is not None else getattr(model, "batch_size", None)
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(
                f"batch_size={batch_size!r} must be a positive integer; pass batch_size= or set model.batch_size"
            )
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers} must be >= 0")
        if encode is None:
            if encoding is None or layout is None:
                raise ValueError(
                    "ArrowDataModule needs encode=callable(table) -> Batch, or layout= and "
                    "encoding= (a fitted model.arrow.Encoding) to use model.arrow.encode"
                )
            from .arrow import encode as arrow_encode  # lazy: only needed on this path

            schema: ModelSchema = getattr(model, "schema")  # noqa: B009 -- any module with a schema
            encode = functools.partial(arrow_encode, schema=schema, layout=layout, enc=encoding)
        self.model = model
        self.train = train
        self.validate = validate
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.encode = encode
        device = next(model.parameters()).device
        if num_workers == 0 and persistent_workers:
            warnings.warn("persistent_workers=True is ignored with num_workers=0", stacklevel=2)
        if pin_memory and device.type != "cuda":
            warnings.warn(
                f"pin_memory=True is ignored: the model is on {device.type!r}, not CUDA",
                stacklevel=2,
            )
        self.persistent_workers = persistent_workers and num_workers > 0
        self.pin_memory = pin_memory and device.type == "cuda"
        self.prefetch_factor = prefetch_factor if num_workers > 0 else None
        self._loaders: dict[str, DeviceLoader] = {}  # reused, so persistent workers persist
        self._feed = SliceFeed()
        self._stream: DataLoader[Batch] | None = None

    def _loader(self, table: pa.Table | None, which: str) -> DeviceLoader:
        if which in self._loaders:
            return self._loaders[which]
        if table is None:
            raise ValueError(f"no {which} table was given; pass {which}=pyarrow.Table")
        loader = DataLoader(
            ArrowBatches(table, self.batch_size, self.encode),
            batch_size=None,  # the dataset yields whole encoded batches
            num_workers=self.num_workers,
            persistent_workers=self.persistent_workers,
            pin_memory=self.pin_memory,
            prefetch_factor=self.prefetch_factor,
        )
        self._loaders[which] = DeviceLoader(loader, self.model)
        return self._loaders[which]

    def stream(self, parts: Iterable[pa.Table], count: int) -> DataLoader[Batch]:
        """The one slice-fed DataLoader (CPU batches, in ``parts`` order), fed ``parts``
        (``count`` of them; a generator is cut lazily as the loader asks for more)."""
        if self._stream is None:
            self._stream = DataLoader(
                EncodeSlices(self.encode),
                batch_size=None,
                sampler=self._feed,
                num_workers=self.num_workers,
                persistent_workers=self.persistent_workers,
                pin_memory=self.pin_memory,
                prefetch_factor=self.prefetch_factor,
            )
        self._feed.parts, self._feed.count = iter(parts), count
        return self._stream

    def close(self) -> None:
        """Stop persistent workers now rather than at garbage collection."""
        it = getattr(self._stream, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self._stream = None

    def train_dataloader(self) -> DeviceLoader:
        return self._loader(self.train, "train")

    def val_dataloader(self) -> DeviceLoader:
        return self._loader(self.validate, "validate")
