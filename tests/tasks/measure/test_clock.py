"""The clock's per-batch windows: CPU spans are the synchronising clock's own reads, reported
after every batch; CUDA spans are event pairs read with one device wait per window. No GPU
here: the CUDA path runs on a fake event class over a scripted device timeline (unverified on
a real device)."""

from __future__ import annotations

from tasks.measure.clock import WINDOW_BATCHES, Clock, Window


class Device:
    """A scripted device timeline: ``t`` seconds advance as the test says work ran."""

    def __init__(self) -> None:
        self.t = 0.0
        self.waits = 0


class FakeEvent:
    """``torch.cuda.Event(enable_timing=True)`` on the scripted timeline: stamped at record
    (the stream reached it), read only after a wait, as CUDA requires."""

    def __init__(self, device: Device) -> None:
        self.device, self.at, self.waited = device, None, False

    def record(self) -> None:
        self.at = self.device.t

    def synchronize(self) -> None:
        self.device.waits += 1
        self.waited = True

    def elapsed_time(self, end_event: FakeEvent) -> float:
        assert end_event.device.waits > 0, "elapsed_time before any wait on the device"
        return (end_event.at - self.at) * 1e3


def _run(window: Window, device: Device, batches: int, warmup: int) -> list[tuple[str, int, float]]:
    """A loop shaped like the engine's: per batch an input wait of 1 ms and a step of
    (batch + 1) * 10 ms; the first ``warmup`` batches are not steady."""
    reports: list[tuple[str, int, float]] = []
    for b in range(batches):
        with window.span(lambda s, b=b: reports.append(("wait", b, s))):
            device.t += 0.001
        with window.span(lambda s, b=b: reports.append(("step", b, s))):
            device.t += (b + 1) * 0.010
        window.batch_done(steady=b >= warmup)
    window.flush()
    return reports


def test_cuda_window_waits_once_per_window_and_reports_every_span_in_order():
    device = Device()
    window = Window(Clock(None), lambda: FakeEvent(device))
    steady = 2 * WINDOW_BATCHES + 3  # two full windows and a partial one
    reports = _run(window, device, 2 + steady, warmup=2)
    # first call and warm-up: one wait each; steady: one per full window, one at the end
    assert device.waits == window.syncs == 2 + 2 + 1
    assert [(kind, b) for kind, b, _ in reports] == [(k, b) for b in range(2 + steady) for k in ("wait", "step")]
    for kind, b, seconds in reports:
        want = 0.001 if kind == "wait" else (b + 1) * 0.010
        assert abs(seconds - want) < 1e-9


def test_cuda_window_reports_a_steady_span_only_at_its_flush():
    device = Device()
    window = Window(Clock(None), lambda: FakeEvent(device))
    got: list[float] = []
    with window.span(got.append):
        device.t += 0.5
    window.batch_done(steady=True)
    assert got == [] and window.pending == 1 and device.waits == 0  # no wait, nothing read yet
    window.flush()
    assert got == [0.5] and device.waits == 1
    window.flush()  # nothing pending: no second wait
    assert device.waits == 1


def test_cpu_window_is_the_synchronising_clock_reported_after_every_batch():
    ticks = iter(float(i) ** 2 for i in range(100))  # reads 0, 1, 4, 9, ...
    clock = Clock(None, now=lambda: next(ticks))
    window = clock.window()
    assert window.new_event is None  # no device: the clock's own reads
    got: list[float] = []
    for _ in range(3):
        with window.span(got.append):
            pass
        window.batch_done(steady=True)
        assert window.pending == 0  # reported at once, where the loop recorded it before
    assert got == [1.0 - 0.0, 9.0 - 4.0, 25.0 - 16.0]
    assert Clock("cpu").window().new_event is None
