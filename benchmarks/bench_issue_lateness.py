"""How late a request is issued when the server's dispatcher waits for its arrival by
sleeping, and when it sleeps then spins for the last stretch.

The server scenario's driver waits for the next scheduled arrival with ``time.sleep``; on a
busy 2-core host the wake can come late, and that lateness is the generator's, not the
system's (``latency.issue_lateness_ms``). This times the overshoot of a wait of 1..50 ms
done three ways, interleaved: ``sleep`` (what the driver does), ``sleep+spin`` (sleep until
``--spin-ms`` before, then spin on the clock) and ``spin`` (busy-wait the whole gap, a core
taken from the system under test). One JSON line per mode at the end.

    python benchmarks/bench_issue_lateness.py [--repeats 200] [--spin-ms 1]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from tasks.measure.clock import wall_clock

GAPS_MS = (1, 5, 20, 50)


def wait(mode: str, until: float, spin_s: float) -> None:
    if mode != "spin":
        ahead = until - wall_clock() - (spin_s if mode == "sleep+spin" else 0.0)
        if ahead > 0:
            time.sleep(ahead)
    if mode != "sleep":
        while wall_clock() < until:
            pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=200, help="waits per gap per mode")
    ap.add_argument("--spin-ms", type=float, default=1.0, help="sleep+spin: spin for this last stretch")
    a = ap.parse_args()
    modes = ("sleep", "sleep+spin", "spin")
    late: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, float] = dict.fromkeys(modes, 0.0)
    rng = np.random.default_rng(0)
    for _ in range(a.repeats):
        for gap in GAPS_MS:
            for m in rng.permutation(modes):  # interleaved: the host's load hits every mode alike
                c0 = time.process_time()
                until = wall_clock() + gap / 1e3
                wait(str(m), until, a.spin_ms / 1e3)
                late[str(m)].append(wall_clock() - until)
                cpu[str(m)] += time.process_time() - c0
    total_wait_s = a.repeats * sum(GAPS_MS) / 1e3
    print(f"{'mode':<11} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'CPU / wait':>11}")
    for m in modes:
        v = np.asarray(late[m]) * 1e3
        p50, p99 = np.percentile(v, [50, 99], method="inverted_cdf")
        print(f"{m:<11} {p50:8.3f} {p99:8.3f} {v.max():8.3f} {cpu[m] / total_wait_s:11.2f}")
    for m in modes:
        v = np.asarray(late[m]) * 1e3
        print(
            json.dumps(
                {
                    "mode": m,
                    "lateness_ms_p50": float(np.percentile(v, 50, method="inverted_cdf")),
                    "lateness_ms_p99": float(np.percentile(v, 99, method="inverted_cdf")),
                    "lateness_ms_max": float(v.max()),
                    "cpu_per_wait_s": cpu[m] / total_wait_s,
                }
            )
        )


if __name__ == "__main__":
    main()
