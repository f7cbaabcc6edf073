"""Eager vs compiled, side by side: ``relflow-bench compile-report SPEC``.

Variants: eager, encoders, pools, encoders+pools. Every measurement is a full
``relflow-bench run`` in a fresh process (compilation state, allocator and caches never
leak between variants), interleaved round by round with the order rotated, so drift on a
shared machine hits every variant alike. Compiled variants run twice per round: with an
empty Inductor cache (cold) and again with the cache the cold run just filled (warm).

Each process is a child MLflow run under one parent run; the summary table (medians over
rounds, order-statistic 95% intervals of those medians from 6 rounds (the default; fewer
rounds print the median and "n<6" instead of an interval), speedup = ratio of median steady
throughput to eager's, in the same rounds) is printed and logged to the parent as ``compile_report.json`` / ``.md``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.measure import keys as K
from tasks.measure.stats import MIN_CI_SAMPLES, median_interval

DEFAULT_ROUNDS = MIN_CI_SAMPLES  # enough rounds for a 95% interval of each median

VARIANTS: dict[str, tuple[bool, bool]] = {
    "eager": (False, False),
    "encoders": (True, False),
    "pools": (False, True),
    "encoders+pools": (True, True),
}


@dataclass
class Sample:
    variant: str
    cache: str  # "none" (eager), "cold" or "warm"
    round: int
    metrics: dict[str, float]
    run_id: str


def _run_variant(
    spec: Path, overrides: list[str], variant: str, cache_dir: Path | None, parent_run_id: str, workdir: Path, tag: str
) -> dict[str, Any]:
    enc, pools = VARIANTS[variant]
    out = workdir / f"{tag}.json"
    env = dict(os.environ)
    if cache_dir is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    cmd = [
        sys.executable,
        "-m",
        "flows.cli",
        "run",
        str(spec),
        "--json",
        str(out),
        "--parent-run",
        parent_run_id,
        "--tag",
        f"relflow.variant={variant}",
        "--tag",
        f"relflow.compile_cache={tag.split('-')[-2]}",
    ]
    for o in [*overrides, f"run.compile.encoders={str(enc).lower()}", f"run.compile.pools={str(pools).lower()}"]:
        cmd += ["--set", o]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"variant {variant} ({tag}) failed with exit {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def collect(spec: Path, overrides: list[str], repeats: int, parent_run_id: str, on_sample=None) -> list[Sample]:
    samples: list[Sample] = []
    names = list(VARIANTS)
    with tempfile.TemporaryDirectory(prefix="relflow-compile-") as tmp:
        workdir = Path(tmp)
        for r in range(repeats):
            order = names[r % len(names) :] + names[: r % len(names)]
            for variant in order:
                if variant == "eager":
                    plan = [("none", None)]
                else:
                    cache = workdir / f"inductor-{variant.replace('+', '_')}-{r}"
                    plan = [("cold", cache), ("warm", cache)]
                for kind, cache in plan:
                    tag = f"{variant.replace('+', '_')}-{kind}-{r}"
                    summary = _run_variant(spec, overrides, variant, cache, parent_run_id, workdir, tag)
                    s = Sample(variant, kind, r, summary["metrics"], summary["run_id"])
                    samples.append(s)
                    if on_sample:
                        on_sample(s)
    return samples


def summarize(samples: list[Sample]) -> list[dict[str, Any]]:
    """One row per variant and cache state: medians over rounds, CIs, speedup vs eager."""

    def pick(variant: str, cache: str, key: str) -> list[float]:
        return [s.metrics.get(key, float("nan")) for s in samples if s.variant == variant and s.cache == cache]

    def med(variant: str, cache: str, key: str) -> float:
        return median_interval(pick(variant, cache, key)).median

    eager_predict = med("eager", "none", K.STEADY_ROWS_PER_S)
    eager_train = med("eager", "none", K.TRAIN_STEADY_ROWS_PER_S)
    rows = []
    for variant in VARIANTS:
        for cache in ("none",) if variant == "eager" else ("cold", "warm"):
            p = median_interval(pick(variant, cache, K.STEADY_ROWS_PER_S))
            t = median_interval(pick(variant, cache, K.TRAIN_STEADY_ROWS_PER_S))
            rows.append(
                {
                    "variant": variant,
                    "cache": cache,
                    "rounds": p.n,
                    "predict_first_call_s": med(variant, cache, K.FIRST_CALL_SECONDS),
                    "predict_steady_rows_per_s": p.median,
                    "predict_ci_low": p.low,
                    "predict_ci_high": p.high,
                    "predict_speedup_vs_eager": p.median / eager_predict if eager_predict else float("nan"),
                    "train_first_call_s": med(variant, cache, K.compute("train", "first_call_seconds")),
                    "train_steady_rows_per_s": t.median,
                    "train_ci_low": t.low,
                    "train_ci_high": t.high,
                    "train_speedup_vs_eager": t.median / eager_train if eager_train else float("nan"),
                    "recompiles": max(
                        pick(variant, cache, K.compute("predict", "recompiles"))
                        + pick(variant, cache, K.compute("train", "recompiles"))
                    ),
                    "host_peak_mib": max(pick(variant, cache, K.HOST_PEAK_BYTES)) / 2**20,
                    "host_peak_excluding_compiler_mib": max(pick(variant, cache, K.HOST_PEAK_EXCLUDING_COMPILER_BYTES))
                    / 2**20,
                }
            )
    return rows


def _interval(low: float | None, high: float | None, n: int) -> str:
    """The 95% interval, or why there is none (too few rounds)."""
    if low is None or high is None:
        return f"n={n}<{MIN_CI_SAMPLES}, no CI"
    return f"{low:,.0f}, {high:,.0f}"


def to_markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| variant | cache | predict first call s | predict steady rows/s [95% CI] | speedup | "
        "train first call s | train steady rows/s [95% CI] | speedup | recompiles | peak RSS MiB | "
        "without compiler MiB |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['cache']} | {r['predict_first_call_s']:.2f} | "
            f"{r['predict_steady_rows_per_s']:,.0f} "
            f"[{_interval(r['predict_ci_low'], r['predict_ci_high'], r['rounds'])}] | "
            f"{r['predict_speedup_vs_eager']:.2f}x | {r['train_first_call_s']:.2f} | "
            f"{r['train_steady_rows_per_s']:,.0f} [{_interval(r['train_ci_low'], r['train_ci_high'], r['rounds'])}] | "
            f"{r['train_speedup_vs_eager']:.2f}x | {int(r['recompiles'])} | {r['host_peak_mib']:,.0f} | "
            f"{r['host_peak_excluding_compiler_mib']:,.0f} |"
        )
    return "\n".join(lines)
