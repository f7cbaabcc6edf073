"""How much slower the same small piece of work runs after the host has been idle.

The server scenario at a low QPS leaves the process idle between Poisson arrivals (200 ms on
average at 5 QPS), and its requests measured several times slower than single_stream's
back-to-back ones. This separates the host from the harness: one fixed forward pass of the
default workload's size, run after a gap of 0 to 200 ms spent either sleeping (as the
server's dispatcher does) or spinning on the CPU, gaps interleaved round by round, in one
process. Ratios are against the back-to-back (0 ms) median of the same run.

    python benchmarks/bench_idle_wake.py [--repeats 30] [--rounds 3] [--threads N]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from tasks.measure.clock import Clock, wall_clock

GAPS_MS = (0, 5, 20, 50, 200)


def spin(seconds: float) -> None:
    end = wall_clock() + seconds
    while wall_clock() < end:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=30, help="timed calls per gap per round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds over all gaps")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    # one request's compute at the default workload's width: a few transformer layers, 1 row
    layer = torch.nn.TransformerEncoderLayer(64, 4, 256, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(1, 96, 64)
    clock = Clock()

    def work() -> float:
        with torch.inference_mode(), clock.measure() as t:
            model(x)
        return t.seconds * 1e3

    for _ in range(50):  # warm-up: allocator, kernels, thread pool
        work()
    ms: dict[tuple[str, int], list[float]] = {}
    for _ in range(a.rounds):
        for how, wait in (("sleep", clock.sleep), ("spin", spin)):
            for gap in GAPS_MS:
                for _ in range(a.repeats):
                    if gap:
                        wait(gap / 1e3)
                    ms.setdefault((how, gap), []).append(work())
    base = float(np.median(ms[("sleep", 0)] + ms[("spin", 0)]))
    print(f"torch {torch.__version__}, {a.threads} threads, {a.rounds} rounds x {a.repeats} calls per gap")
    print(f"{'idle as':<8} {'gap ms':>7} {'p50 ms':>8} {'p90 ms':>8} {'p50 / back-to-back':>19}")
    for (how, gap), v in sorted(ms.items()):
        p50, p90 = np.percentile(v, [50, 90])
        print(f"{how:<8} {gap:>7} {p50:>8.2f} {p90:>8.2f} {p50 / base:>18.2f}x")


if __name__ == "__main__":
    main()
