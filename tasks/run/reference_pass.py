"""Quality against a reference checkpoint, before switching weight formats.

The seed note says to compare task metrics against the reference checkpoint before
switching formats. That reference cannot be downloaded here, so it is the fp16 version of
the same trained checkpoint (``relflow-bench quantize CKPT --format fp16``), given as
``run.reference_checkpoint``. After the timed passes, the reference model (PyTorch eager,
expanded to fp32) predicts the same held-out rows; this extra pass is never inside e2e.

``quality.delta_vs_reference`` = the run's headline quality minus the reference's (for
``mae`` a positive delta is worse); ``run.max_quality_drop`` makes the run INVALID when the
drop (the delta in the worse direction) exceeds it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from model.arrow import Encoding
from tasks.backends.checkpoint import LoadedCheckpoint, load_run_checkpoint
from tasks.backends.lengths import saved_lengths
from tasks.libraries.reference.engine import Engine
from tasks.measure import keys as K
from tasks.runtime.errors import UserError
from tasks.spec import Spec
from tasks.spec.derived import eager_spec
from tasks.stages.tensorize import Tensorized


def check_reference(spec: Spec, encoding: Encoding | None) -> LoadedCheckpoint | None:
    """Load and check ``run.reference_checkpoint`` up front (same schema, same encoding)."""
    path = spec.run.reference_checkpoint
    if not path:
        return None
    ref = load_run_checkpoint(Path(path), spec)
    # The reference scores rows the run's chain tensorized at the run's reserved lengths, so
    # it must reserve the same (the loaders' rule accepts a saved length below max_length).
    want = {b.name: b.max_length for b, _ in spec.schema_.walk()}
    have = saved_lengths(ref.schema)
    if have != want:
        raise UserError(
            f"run.reference_checkpoint '{path}' reserves {have} rows per parent, the run reserves "
            f"{want}; use a reference made from the served checkpoint (relflow-bench quantize CKPT "
            "--format fp16)."
        )
    if encoding is not None and ref.encoding.to_dict() != encoding.to_dict():
        raise UserError(
            f"run.reference_checkpoint '{path}' was fitted on other vocabularies than the served "
            "weights, so its quality is not comparable; use the fp16 version of the same checkpoint "
            "(relflow-bench quantize CKPT --format fp16)."
        )
    return ref


def reference_spec(spec: Spec) -> Spec:
    """The run's spec for the reference pass: PyTorch eager, in-process encoding, fp32."""
    return eager_spec(spec, precision="fp32")


def reference_quality(
    spec: Spec,
    ref: LoadedCheckpoint,
    chunks: int,
    prepare: Callable[[int], Tensorized],
    device: torch.device,
    scored_keys: list[np.ndarray] | None = None,
    prepare_keys: Callable[[np.ndarray], Tensorized] | None = None,
) -> dict[str, float]:
    """Held-out quality of the reference weights over the rows the run scored: offline, every
    chunk once (``prepare(i)``: the workload's chain, untimed), as the run's last pass did; a
    request scenario, the root keys of every served call (``scored_keys``, repeats and the
    cold request included), each row counted as often as the run's request quality counted it."""
    rspec = reference_spec(spec)
    engine = Engine(rspec, ref.schema, device, ref.model, encoding=ref.encoding)
    try:
        if scored_keys is None:
            for i in range(chunks):
                engine.predict(prepare(i), ("prediction",))
        else:
            assert prepare_keys is not None  # request scenarios prepare arbitrary keys
            _score_served_rows(engine, scored_keys, prepare_keys, spec.run.chunk_rows)
    finally:
        engine.close()
    return engine.quality.metrics()


def _score_served_rows(
    engine: Engine, scored_keys: list[np.ndarray], prepare_keys: Callable[[np.ndarray], Tensorized], chunk_rows: int
) -> None:
    """Each distinct served key predicted once, its row then counted once per serving: the
    same multiset of rows as the run's request quality, without one forward per request."""
    served = np.concatenate(scored_keys) if scored_keys else np.empty(0, dtype=np.int64)
    distinct = np.unique(served)
    preds, labels, masks, scored, keys = [], [], [], [], []
    for i in range(0, len(distinct), chunk_rows):
        tz = prepare_keys(distinct[i : i + chunk_rows])
        outs = engine.predict(tz, ("prediction",))
        assert outs.labels is not None and outs.label_mask is not None
        preds.append(outs.tensors["prediction"])
        labels.append(outs.labels)
        masks.append(outs.label_mask)
        scored.append(tz.is_scored)
        keys.append(tz.keys.to_numpy(zero_copy_only=False))
    engine.begin_predict_pass()  # drop the once-each scores: the multiset replaces them
    if not keys:
        return
    have = np.concatenate(keys)
    order = np.argsort(have, kind="stable")
    at = order[np.searchsorted(have, served, sorter=order)]
    assert np.array_equal(have[at], served), "a served key was not among the reference pass's rows"
    index = torch.from_numpy(at)
    engine.quality.add(
        torch.cat(preds)[index], torch.cat(labels)[index], torch.cat(masks)[index], scored=torch.cat(scored)[index]
    )


def quality_delta(headline: str, run: dict[str, float], reference: dict[str, float]) -> dict[str, float]:
    out = {K.quality_reference(k): v for k, v in reference.items()}
    if headline in run and headline in reference:
        delta = run[headline] - reference[headline]
        out[K.QUALITY_DELTA_VS_REFERENCE] = delta
        out[K.QUALITY_DROP_VS_REFERENCE] = delta if headline == "mae" else -delta
    return out


def drop_reasons(spec: Spec, metrics: dict[str, float]) -> list[str]:
    limit = spec.run.max_quality_drop
    if limit is None:
        return []
    drop = metrics.get(K.QUALITY_DROP_VS_REFERENCE)
    if drop is None:
        return [f"{K.QUALITY_DROP_VS_REFERENCE} missing, run.max_quality_drop cannot be checked"]
    if math.isnan(drop):  # NaN > limit is false: it once passed the rule
        return [
            f"{K.QUALITY_DROP_VS_REFERENCE} is NaN (the run's or the reference's headline quality "
            f"is NaN), so run.max_quality_drop {limit} cannot be shown to hold"
        ]
    if drop > limit:
        return [f"quality drop vs reference {drop:.4f} > run.max_quality_drop {limit}"]
    return []
