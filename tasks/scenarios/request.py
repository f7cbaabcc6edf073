"""One request through the serving path, each step timed with the run's clock:

    retrieve (by key) -> preprocess -> tensorize -> compute -> calibrate -> write

The same stage functions as the offline scenario, called directly (a Prefect task per
request would add orchestration to every request's latency). Step times also add into
the run's stage table; held-out labels feed the calibration quality outside the timing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.measure import keys as K
from tasks.stages import calibrate
from tasks.stages.compute import Engine
from tasks.stages.preprocess import preprocess
from tasks.stages.retrieve import retrieve
from tasks.stages.tensorize import fit, tensorize
from tasks.stages.write import to_table


def ensure_engine(pipe: Any) -> None:
    """A predict run without a checkpoint has no encoding yet: fit it on the first chunk,
    outside every timing (a pure speed run, as in the offline scenario)."""
    if pipe.engine is not None:
        return
    spec = pipe.spec
    if pipe.enc is None:
        pre = preprocess(spec, retrieve(spec, pipe.p.sources, pipe.chunks[0]))
        pipe.enc, pipe.schema = fit(spec, pre)
    state = pipe.p.checkpoint["model"] if pipe.p.checkpoint else None
    pipe.engine = Engine(spec, pipe.schema, pipe.p.device, state, pipe.clock, pipe.enc)


class RequestPath:
    def __init__(self, pipe: Any, writer: Any, quality: calibrate.CalibrationQuality) -> None:
        ensure_engine(pipe)
        self.pipe, self.writer, self.quality = pipe, writer, quality
        self.spec, self.clock = pipe.spec, pipe.clock
        self.outputs = tuple(self.spec.task.outputs)

    def __call__(self, keys: np.ndarray) -> dict[str, float]:
        """Serve one request (or one batch of requests) for ``keys``; step -> seconds."""
        spec, pipe, clock, res = self.spec, self.pipe, self.clock, self.pipe.result
        steps: dict[str, float] = {}
        with clock.measure() as t:
            r = retrieve(spec, pipe.p.sources, keys)
        steps["retrieve"] = t.seconds
        with clock.measure() as t:
            pre = preprocess(spec, r)
        steps["preprocess"] = t.seconds
        with clock.measure() as t:
            tz = tensorize(spec, pre, pipe.enc, pipe.schema)
        steps["tensorize"] = t.seconds
        with clock.measure() as t:
            outs = pipe.engine.predict(tz, self.outputs)
        steps["compute"] = t.seconds
        if outs.label_mask is not None:
            self.quality.add(outs.tensors["prediction"], outs.labels, outs.label_mask)
        with clock.measure() as t:
            outs = calibrate.calibrate_outputs(outs, pipe.temperature, spec.task.kind)
        steps["calibrate"] = t.seconds
        with clock.measure() as t:
            self.writer.write(to_table(spec, pipe.engine.schema, pipe.enc, tz.keys, outs))
        steps["write"] = t.seconds
        rows = tz.root_rows
        for name, sec in steps.items():
            res.stages["predict"][name].add(sec, rows)
        res.bytes_read += r.bytes_read
        res.extra[K.DATA_ROWS_READ] = res.extra.get(K.DATA_ROWS_READ, 0.0) + sum(r.rows_read.values())
        res.rows_predicted += rows
        res.coords_present += tz.coords_present
        res.coords_reserved += tz.coords_reserved
        return steps
