"""Outputs that do not depend on how they were served (MLPerf's accuracy-vs-performance
check, run.request.check_outputs) and a repeated key that must not get faster (a cache).

Served side: each served call's root keys and the prediction values its write step got
(calibrated), kept by reference inside the measured span (``ServedOutputs.keep``: two list
appends, no copy, no conversion). Offline side, after the timed region, still under the host
lock: every distinct served key once, in ``run.chunk_rows`` chunks, through the same chain
(``Chain.predict_untimed``: the served engine, backend, weights and temperature; no run
figure moves). Each serving of a root is compared with its offline row over the target's
present cells:

- ``requests.outputs_max_abs_diff``: the largest |served - offline| over every serving;
- ``requests.outputs_mismatched_roots``: distinct roots with a serving beyond the tolerance
  (tasks/spec/tolerance.py, by the serving numerics), judged on |served - offline| /
  max(1, |offline|): absolute near zero, relative for large values; one makes the run
  INVALID, the reason names the figure, the tolerance and the worst root.

``requests.repeat_key_speedup``: for each root key in at least two steady requests (the cold
request left out), the latency of its first serving over the median latency of its later
servings; the figure is the median of that ratio over those keys (``requests.repeat_keys``).
About 1 when nothing is cached; well above 1 means later servings of a key got faster.

Offline (``run.check_outputs``): the last predict pass's rows are kept the same way and
compared with a plain pass over the same keys: a second ``Chain`` of the same class over the
same sources, encoding, schema, weights and temperature, with no bucketing, padded attention
and PyTorch eager (``plain_spec``): bucketed vs unbucketed, packed vs padded and ONNX Runtime
or Triton vs eager, as ``predict.outputs_max_abs_diff`` and the three others of its family.
Native fp8 weights are not covered (the plain engine loads plain Linear weights).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import torch

from tasks.measure import keys as K
from tasks.run.chain import Chain, Weights
from tasks.spec import RunSettings, Spec
from tasks.spec.derived import eager_spec
from tasks.spec.tolerance import output_tolerance
from tasks.stages.engine import PredictOutputs


@dataclass
class ServedOutputs:
    """Per served call (the cold one included): its root keys as tensorized, the calibrated
    prediction the write step got, and the present masks of its nodes."""

    keys: list[pa.Array] = field(default_factory=list)
    outputs: list[PredictOutputs] = field(default_factory=list)

    def keep(self, keys: pa.Array, outs: PredictOutputs) -> None:
        """Inside the measured span: references only."""
        self.keys.append(keys)
        self.outputs.append(outs)

    def release(self) -> None:
        """After the check: the references let go, whoever still holds this record."""
        self.keys.clear()
        self.outputs.clear()


@dataclass
class OutputCheck:
    roots_checked: int  # distinct served roots
    servings: int  # root rows compared (a root served n times counts n)
    max_abs_diff: float
    mismatched_roots: int
    worst_root: str | None  # the root with the largest difference
    tolerance_row: str
    tolerance: float
    offline: bool = False  # run.check_outputs (offline keys), else run.request.check_outputs (request keys)

    @property
    def _keys(self) -> tuple[str, str, str, str]:
        if self.offline:
            return (
                K.PREDICT_OUTPUTS_MAX_ABS_DIFF,
                K.PREDICT_OUTPUTS_MISMATCHED_ROOTS,
                K.PREDICT_OUTPUTS_ROOTS_CHECKED,
                K.PREDICT_OUTPUTS_TOLERANCE,
            )
        return (
            K.REQUESTS_OUTPUTS_MAX_ABS_DIFF,
            K.REQUESTS_OUTPUTS_MISMATCHED_ROOTS,
            K.REQUESTS_OUTPUTS_ROOTS_CHECKED,
            K.REQUESTS_OUTPUTS_TOLERANCE,
        )

    def metrics(self) -> dict[str, float]:
        diff, mismatched, checked, tolerance = self._keys
        return {
            diff: self.max_abs_diff,
            mismatched: float(self.mismatched_roots),
            checked: float(self.roots_checked),
            tolerance: self.tolerance,
        }

    def reasons(self) -> list[str]:
        if self.mismatched_roots == 0:
            return []
        diff = "NaN" if math.isnan(self.max_abs_diff) else f"{self.max_abs_diff:.3g}"
        other = "a plain pass (no bucketing, padded, PyTorch eager)" if self.offline else "an offline pass"
        return [
            f"{self._keys[0]} {diff}: beyond the {self.tolerance_row} tolerance {self.tolerance:g} "
            f"(|served - offline| / max(1, |offline|), tasks/spec/tolerance.py): "
            f"{self.mismatched_roots} of {self.roots_checked} served roots differ "
            f"from {other} over the same keys, worst root {self.worst_root}; the serving path "
            "computes something else (a cache, stale weights, another calibration, a wrong fast path)"
        ]


def _target_values(chain: Chain, outs: PredictOutputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The prediction ``[B, L1..Ld, (C)]`` and the target's present mask broadcast to it."""
    engine = chain.engine
    assert engine is not None  # the served calls built it
    return outs.tensors["prediction"], engine.target_present(outs)


def _per_root_diff(
    a: torch.Tensor, am: torch.Tensor, b: torch.Tensor, bm: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, over the cells present on either side: the largest |a - b|, and the largest
    |a - b| / max(1, |b|), the difference the tolerance judges (absolute for values within
    one unit of zero, relative above: float error grows with a value's size, and calibrated
    logits reach hundreds). A cell present on one side only, or NaN on one side only, is an
    infinite difference (both NaN: equal)."""
    shape = [max(x, y) for x, y in zip(a.shape, b.shape, strict=True)]

    def pad(x: torch.Tensor, fill: float | bool) -> torch.Tensor:
        out = torch.full(shape, fill, dtype=x.dtype)
        out[tuple(slice(0, n) for n in x.shape)] = x
        return out

    a, b, am, bm = pad(a, 0.0), pad(b, 0.0), pad(am, False), pad(bm, False)
    d = (a - b).abs()
    d = torch.where(a.isnan() & b.isnan(), 0.0, torch.nan_to_num(d, nan=math.inf))
    d = torch.where(am & bm, d, torch.where(am ^ bm, math.inf, 0.0))
    scaled = d / torch.nan_to_num(b.abs(), nan=1.0).clamp(min=1.0)
    return d.reshape(d.shape[0], -1).amax(1), scaled.reshape(d.shape[0], -1).amax(1)


def check_outputs(chain: Chain, served: ServedOutputs, run: RunSettings, reference: Chain | None = None) -> OutputCheck:
    """Compare every served root row with an offline pass over the distinct served keys,
    through ``reference`` (default: the served chain itself)."""
    row, tol = output_tolerance(run)
    offline = reference is not None
    if not served.keys:
        return OutputCheck(0, 0, 0.0, 0, None, row, tol, offline)
    ref_chain = reference or chain
    served_keys = pa.concat_arrays(served.keys).to_numpy(zero_copy_only=False)
    distinct = np.unique(served_keys)
    ref_keys, ref_vals, ref_masks = [], [], []
    n = run.chunk_rows
    for i in range(0, len(distinct), n):
        tz, outs = ref_chain.predict_untimed(distinct[i : i + n])
        v, m = _target_values(chain, outs)
        ref_keys.append(tz.keys.to_numpy(zero_copy_only=False))
        ref_vals.append(v)
        ref_masks.append(m)
    have = np.concatenate(ref_keys)
    order = np.argsort(have, kind="stable")
    diffs = []
    for outs in served.outputs:  # one comparison per served call (a request or a server batch)
        v, m = _target_values(chain, outs)
        diffs.append((v, m))
    # The offline rows of the served keys, in serving order, then one vectorised comparison.
    at = order[np.searchsorted(have, served_keys, sorter=order)]
    assert np.array_equal(have[at], served_keys), "a served key was not among the offline pass's rows"
    ref_v, ref_m = _cat_padded(ref_vals, ref_masks)
    srv_v, srv_m = _cat_padded([v for v, _ in diffs], [m for _, m in diffs])
    index = torch.from_numpy(at)
    per_serving, per_serving_scaled = (x.numpy() for x in _per_root_diff(srv_v, srv_m, ref_v[index], ref_m[index]))
    # per distinct root: its worst serving
    root_of = np.searchsorted(distinct, served_keys)
    worst = np.full(len(distinct), -np.inf)
    np.maximum.at(worst, root_of, per_serving)
    worst_scaled = np.full(len(distinct), -np.inf)
    np.maximum.at(worst_scaled, root_of, per_serving_scaled)
    bad = ~(worst_scaled <= tol)
    top = int(np.argmax(worst_scaled))
    return OutputCheck(
        roots_checked=len(distinct),
        servings=len(served_keys),
        max_abs_diff=float(worst.max()),
        mismatched_roots=int(bad.sum()),
        worst_root=str(distinct[top]),
        tolerance_row=row,
        tolerance=tol,
        offline=offline,
    )


def plain_spec(spec: Spec) -> Spec:
    """The run's spec for the plain pass: no bucketing, padded attention, PyTorch eager, the
    same precision (so the tolerance is the served numerics' row)."""
    return eager_spec(spec, bucketing="off", packing="off")


def check_offline_outputs(chain: Chain, served: ServedOutputs) -> OutputCheck:
    """``run.check_outputs``: the served pass's rows vs the plain pass's, same weights and temperature."""
    engine = chain.reference_engine()  # other libraries refuse run.check_outputs (tasks/libraries)
    assert chain.encoding is not None  # after the predict passes
    plain = Chain(
        plain_spec(chain.spec),
        chain.sources,
        chain.device,
        weights=Weights(
            model=engine.model.state_dict(),
            temperature=chain.temperature,
            encoding=chain.encoding,
            schema=chain.schema,
        ),
    )
    try:
        return check_outputs(chain, served, chain.spec.run, reference=plain)
    finally:
        if plain.engine is not None:
            plain.engine.close()


def _cat_padded(values: list[torch.Tensor], masks: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate along rows, padding branch dimensions to the longest (padding: absent)."""
    shape = [max(v.shape[d] for v in values) for d in range(1, values[0].dim())]
    rows = sum(v.shape[0] for v in values)
    out_v = torch.zeros(rows, *shape, dtype=values[0].dtype)
    out_m = torch.zeros(rows, *shape, dtype=torch.bool)
    at = 0
    for v, m in zip(values, masks, strict=True):
        index = (slice(at, at + v.shape[0]), *(slice(0, s) for s in v.shape[1:]))
        out_v[index], out_m[index] = v, m
        at += v.shape[0]
    return out_v, out_m


def repeat_key_speedup(request_keys: list[np.ndarray], latency_s: list[float]) -> dict[str, float]:
    """``requests.repeat_key_speedup`` and ``requests.repeat_keys`` over the steady requests
    (``request_keys[i]``: the root keys of request ``i``, whose latency is ``latency_s[i]``);
    empty when no key was asked for twice."""
    if not request_keys:
        return {}
    counts = np.array([len(k) for k in request_keys])
    keys = np.concatenate(request_keys)
    req = np.repeat(np.arange(len(request_keys)), counts)
    lat = np.asarray(latency_s)[req]
    uniq, key_id = np.unique(keys, return_inverse=True)
    order = np.lexsort((req, key_id))  # by key, then by request: each key's first serving leads
    key_id, lat = key_id[order], lat[order]
    first_at = np.flatnonzero(np.r_[True, key_id[1:] != key_id[:-1]])
    servings = np.diff(np.r_[first_at, len(key_id)])
    repeated = servings >= 2
    if not repeated.any():
        return {K.REQUESTS_REPEAT_KEYS: 0.0}
    first = lat[first_at]
    later = np.ones(len(key_id), dtype=bool)
    later[first_at] = False
    # median of each key's later servings: sort them by (key, latency), take the middle one(s)
    lk, ll = key_id[later], lat[later]
    o = np.lexsort((ll, lk))
    lk, ll = lk[o], ll[o]
    start = np.searchsorted(lk, np.arange(len(uniq)))
    m = servings - 1  # later servings per key
    lo = start + np.maximum(m - 1, 0) // 2
    hi = start + m // 2
    sel = repeated
    median = (ll[lo[sel]] + ll[hi[sel]]) / 2
    ratio = first[sel] / np.maximum(median, 1e-12)
    return {K.REQUESTS_REPEAT_KEY_SPEEDUP: float(np.median(ratio)), K.REQUESTS_REPEAT_KEYS: float(sel.sum())}
