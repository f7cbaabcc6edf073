"""Eager vs compiled, side by side: ``relflow-bench compile-report SPEC``.

Variants: eager, encoders, pools, encoders+pools. Every measurement is a full
``relflow-bench run`` in a fresh process (compilation state, allocator and caches never
leak between variants), interleaved round by round with the order rotated, so drift on a
shared machine hits every variant alike. Compiled variants run twice per round: with an
empty cache (cold) and again with the caches the cold run just filled (warm): every compiler
cache (Inductor's and Triton's, ``COMPILER_CACHES``) moves into one folder per variant and round.

Each process is a child MLflow run under one parent run; the summary table (medians over
rounds, order-statistic 95% intervals of those medians from 6 rounds (the default; fewer
rounds print the median and "n<6" instead of an interval), speedup = ratio of median steady
throughput to eager's, in the same rounds, with (from 6 rounds) the order-statistic 95%
interval of the median per-round ratio: each round's variant run over that round's eager
run, a pair that shares the machine's state) is printed and logged to the parent as
``compile_report.json`` / ``.md``. A compiled variant whose paired speedup interval lies wholly
below 1 is named in a note under the table (``slower_than_eager``), judged by the same paired
per-round ratio, never by two unpaired intervals that carry the host's drift between rounds.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from flows.sweeps.launch import compiler_cache_env
from tasks.measure import keys as K
from tasks.measure.report import (
    Cell,
    Group,
    RunSummary,
    Sample,
    groups,
    interval_text,
    markdown_table,
    ratio_interval,
    slower_by_paired_ratio,
)
from tasks.measure.report import summarize as summarize_groups

VARIANTS: dict[str, tuple[bool, bool]] = {
    "eager": (False, False),
    "encoders": (True, False),
    "pools": (False, True),
    "encoders+pools": (True, True),
}


# COMPILER_CACHES (flows/sweeps/launch.py) pointed into one folder per (variant, round): a
# "cold" run starts with all of them empty, its "warm" twin reuses exactly what it filled.


def _run_variant(
    spec: Path, overrides: list[str], variant: str, cache_dir: Path | None, parent_run_id: str, workdir: Path, tag: str
) -> RunSummary:
    enc, pools = VARIANTS[variant]
    out = workdir / f"{tag}.json"
    env = dict(os.environ)
    if cache_dir is not None:
        env.update(compiler_cache_env(cache_dir))
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
    return RunSummary.from_json(out.read_text())


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
                    report = _run_variant(spec, overrides, variant, cache, parent_run_id, workdir, tag)
                    s = Sample(variant, r, report, cache=kind)
                    samples.append(s)
                    if on_sample:
                        on_sample(s)
    return samples


def summarize(samples: list[Sample]) -> list[dict[str, Cell]]:
    """One row per variant and cache state: medians over rounds, CIs, speedup vs eager."""
    order = [(v, c) for v in VARIANTS for c in (("none",) if v == "eager" else ("cold", "warm"))]
    ordered = sorted(samples, key=lambda s: order.index((s.variant, s.cache)))  # stable: rounds stay in order
    eager = next((g for g in groups(ordered, lambda s: (s.variant, s.cache)) if g.key == ("eager", "none")), None)

    def speedup(g: Group, key: str) -> tuple[float, float | None, float | None]:
        base = eager.median(key) if eager else math.nan
        ratio = g.median(key) / base if base else math.nan
        paired = ratio_interval(g.by_round(key), eager.by_round(key)) if eager else None
        return ratio, paired.low if paired else None, paired.high if paired else None

    def ci(g: Group, key: str, side: int) -> float | None:
        mi = g.interval(key)
        return None if mi is None else (mi.low, mi.high)[side]

    def recompiles(g: Group) -> float:
        # NaN (printed "-") when no round logged the count: never a silent 0, never max() of NaN
        return max(
            g.values(K.compute("predict", "recompiles")) + g.values(K.compute("train", "recompiles")),
            default=math.nan,
        )

    p, t = K.STEADY_ROWS_PER_S, K.TRAIN_STEADY_ROWS_PER_S
    return summarize_groups(
        ordered,
        {
            "rounds": lambda g: len(g.samples),
            "predict_first_call_s": lambda g: g.median(K.FIRST_CALL_SECONDS),
            "predict_steady_rows_per_s": lambda g: g.median(p),
            "predict_ci_low": lambda g: ci(g, p, 0),
            "predict_ci_high": lambda g: ci(g, p, 1),
            "predict_speedup_vs_eager": lambda g: speedup(g, p)[0],
            "predict_speedup_ci_low": lambda g: speedup(g, p)[1],
            "predict_speedup_ci_high": lambda g: speedup(g, p)[2],
            "train_first_call_s": lambda g: g.median(K.compute("train", "first_call_seconds")),
            "train_steady_rows_per_s": lambda g: g.median(t),
            "train_ci_low": lambda g: ci(g, t, 0),
            "train_ci_high": lambda g: ci(g, t, 1),
            "train_speedup_vs_eager": lambda g: speedup(g, t)[0],
            "train_speedup_ci_low": lambda g: speedup(g, t)[1],
            "train_speedup_ci_high": lambda g: speedup(g, t)[2],
            "recompiles": recompiles,
            "host_peak_mib": lambda g: g.max(K.HOST_PEAK_BYTES) / 2**20,
            "host_peak_excluding_compiler_mib": lambda g: g.max(K.HOST_PEAK_EXCLUDING_COMPILER_BYTES) / 2**20,
        },
        by=lambda s: (s.variant, s.cache),
        names=("variant", "cache"),
    )


SLOWER_TAG = "relflow.report.compiled_slower_than_eager"  # on the parent: the notes below, "; "-joined


def slower_than_eager(rows: list[dict[str, Cell]]) -> list[str]:
    """A note for each compiled variant whose paired per-round speedup over eager (predict or
    train; the table's speedup interval) lies wholly below 1: compiling never slows a run down
    without the report saying so."""
    notes = []
    for phase in ("predict", "train"):
        notes += slower_by_paired_ratio(
            rows,
            label=lambda r: f"{r['variant']} ({r['cache']} cache)",
            is_candidate=lambda r: r["variant"] != "eager",
            baseline="eager",
            figure=f"{phase} steady rows/s",
            low=f"{phase}_speedup_ci_low",
            high=f"{phase}_speedup_ci_high",
        )
    return notes


def _speedup(r: dict[str, Cell], phase: str) -> str:
    """``1.23x``, with the paired per-round interval when the rounds support one."""
    ratio, low, high = r[f"{phase}_speedup_vs_eager"], r[f"{phase}_speedup_ci_low"], r[f"{phase}_speedup_ci_high"]
    if not isinstance(ratio, int | float) or math.isnan(ratio):
        return "-"
    text = f"{ratio:.2f}x"
    return text if low is None or high is None else f"{text} [{low:.2f}, {high:.2f}]"


def _num(value: Cell, fmt: str) -> str:
    """A figure, or "-" when no round logged it (a train figure of a predict-mode spec)."""
    return "-" if not isinstance(value, int | float) or math.isnan(value) else format(value, fmt)


def to_markdown(rows: list[dict[str, Cell]]) -> str:
    header = [
        "variant",
        "cache",
        "predict first call s",
        "predict steady rows/s [95% CI]",
        "speedup",
        "train first call s",
        "train steady rows/s [95% CI]",
        "speedup",
        "recompiles",
        "peak RSS MiB",
        "without compiler MiB",
    ]
    table = markdown_table(
        header,
        (
            [
                str(r["variant"]),
                str(r["cache"]),
                _num(r["predict_first_call_s"], ".2f"),
                _num(r["predict_steady_rows_per_s"], ",.0f")
                + f" [{interval_text(r['predict_ci_low'], r['predict_ci_high'], r['rounds'])}]",
                _speedup(r, "predict"),
                _num(r["train_first_call_s"], ".2f"),
                _num(r["train_steady_rows_per_s"], ",.0f")
                + f" [{interval_text(r['train_ci_low'], r['train_ci_high'], r['rounds'])}]",
                _speedup(r, "train"),
                _num(r["recompiles"], ".0f"),
                _num(r["host_peak_mib"], ",.0f"),
                _num(r["host_peak_excluding_compiler_mib"], ",.0f"),
            ]
            for r in rows
        ),
    )
    return "\n\n".join([table, *(f"Note: {n}." for n in slower_than_eager(rows))])
