"""What the requests ask for and when: drawn up front from the run's seed, so two runs of
the same spec face the same traffic."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tasks.sources.tables import Sources
from tasks.spec import Spec
from tasks.stages.preprocess import split_is_train
from tasks.stages.retrieve import read_rows


def validation_keys(keys: np.ndarray, spec: Spec, sources: Sources) -> np.ndarray:
    """The scored root keys requests are drawn from: the held-out ones of the key hash, or those
    of the ``test`` split where ``schema.root.split`` names one (a time-anchored task)."""
    root = spec.schema_.root
    if root.split is not None:
        if len(keys) == 0:
            return keys
        table, _ = read_rows(sources[root.table], [root.key, root.split], root.key, pa.array(keys))
        test = pc.equal(table[root.split].cast(pa.string()), "test").fill_null(False)
        scored: np.ndarray = table.filter(test)[root.key].to_numpy()
        return np.sort(scored)
    is_train: np.ndarray = split_is_train(pl.Series(keys), spec.task.validation_fraction).to_numpy()
    held_out: np.ndarray = keys[~is_train]
    return held_out


def request_keys(pool: np.ndarray, requests: int, roots: int, seed: int) -> np.ndarray:
    """``[requests, roots]`` keys: distinct within a request, cycling through seeded
    permutations of ``pool`` so every key is asked for before any repeats."""
    if len(pool) < roots:
        raise ValueError(f"only {len(pool)} validation keys for {roots} roots per request")
    rng = np.random.default_rng(seed)
    need = requests * roots
    cycles = -(-need // len(pool))
    flat = np.concatenate([rng.permutation(pool) for _ in range(cycles)])[:need]
    out = flat.reshape(requests, roots)
    if roots > 1:  # a cycle boundary can repeat a key inside one request: redraw those rows
        ordered = np.sort(out, axis=1)
        for r in np.nonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))[0]:
            out[r] = rng.choice(pool, roots, replace=False)
    return out


def poisson_arrivals(qps: float, min_requests: int, min_duration_s: float, seed: int) -> np.ndarray:
    """Arrival times (seconds from the start) of an open-loop Poisson process at ``qps``,
    long enough for both ``min_requests`` requests and ``min_duration_s`` seconds."""
    rng = np.random.default_rng([seed, 0x5EED])
    n = max(min_requests, int(np.ceil(qps * min_duration_s)))
    times = np.cumsum(rng.exponential(1.0 / qps, n))
    while times[-1] < min_duration_s:  # a slow draw: extend until the duration is covered
        more = times[-1] + np.cumsum(rng.exponential(1.0 / qps, max(n // 4, 16)))
        times = np.concatenate([times, more])
    keep = max(min_requests, int(np.searchsorted(times, min_duration_s)) + 1)
    return times[:keep]
