"""Coverage of the repeat intervals, by simulation: does a "95% CI" cover 95% of the time?

For each sample size n, 2,000 samples of n are drawn from a known, skewed law (log-normal
with sigma 0.5, like timing noise; true median 1.0) and we count how often each method's
95% interval holds the true median:

- percentile bootstrap of the median (what the harness used before; reimplemented here as
  the reference): with 2-3 samples it is just [min, max];
- the order-statistic interval (``tasks.measure.stats.median_interval``, what the harness uses):
  none below 6 samples, and an exact, stated level from 6 on.

    python benchmarks/interval_coverage.py [--draws 2000]

Prints a table and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from tasks.measure.stats import median_interval


def bootstrap_median_ci(x: np.ndarray, rng: np.random.Generator, resamples: int = 2000) -> tuple[float, float]:
    boot = np.median(rng.choice(x, size=(resamples, x.size), replace=True), axis=1)
    lo, hi = np.quantile(boot, [0.025, 0.975])
    med = float(np.median(x))
    return min(lo, med), max(hi, med)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=2000)
    ap.add_argument("--sizes", type=int, nargs="+", default=[3, 4, 5, 6, 9, 12, 20])
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for n in args.sizes:
        boot_hits = order_hits = 0
        level = None
        for _ in range(args.draws):
            x = rng.lognormal(0.0, 0.5, size=n)
            lo, hi = bootstrap_median_ci(x, rng)
            boot_hits += lo <= 1.0 <= hi
            iv = median_interval(x)
            if iv.has_interval:
                order_hits += iv.low <= 1.0 <= iv.high
                level = iv.level
        rows.append(
            {
                "n": n,
                "bootstrap_coverage": boot_hits / args.draws,
                "order_statistic_coverage": order_hits / args.draws if level else None,
                "order_statistic_level": level,
            }
        )
    print(f"{'n':>3} {'bootstrap (old)':>16} {'order-statistic':>16} {'stated level':>13}")
    for r in rows:
        order = f"{r['order_statistic_coverage']:.1%}" if r["order_statistic_level"] else "no 95% CI"
        level = f"{r['order_statistic_level']:.1%}" if r["order_statistic_level"] else "-"
        print(f"{r['n']:>3} {r['bootstrap_coverage']:>16.1%} {order:>16} {level:>13}")
    print(json.dumps({"draws": args.draws, "rows": rows}))


if __name__ == "__main__":
    main()
