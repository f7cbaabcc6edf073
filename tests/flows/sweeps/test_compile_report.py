"""The compile report's table from measured samples (no processes started)."""

from __future__ import annotations

import pytest

from flows.sweeps.compile_report import summarize as compile_summarize
from flows.sweeps.compile_report import to_markdown as compile_markdown
from tasks.measure import keys as K
from tasks.measure.report import RunSummary, Sample


def _compile_sample(variant: str, cache: str, r: int, steady: float) -> Sample:
    m = {
        K.STEADY_ROWS_PER_S: steady,
        K.TRAIN_STEADY_ROWS_PER_S: steady / 2,
        K.FIRST_CALL_SECONDS: 0.5,
        K.compute("train", "first_call_seconds"): 1.5,
        K.compute("predict", "recompiles"): 0.0,
        K.compute("train", "recompiles"): float(r == 3),
        K.HOST_PEAK_BYTES: 2.0**30,
        K.HOST_PEAK_EXCLUDING_COMPILER_BYTES: 2.0**29,
    }
    return Sample(variant, r, RunSummary(f"{variant}-{cache}-{r}", m, "VALID"), cache=cache)


def test_compile_report_speedup_is_paired_by_round():
    # eager drifts up round by round; encoders (warm) is exactly 1.5x eager in its own round
    samples = []
    for r in range(6):
        eager = 1000.0 + 100 * r
        samples.append(_compile_sample("encoders", "cold", r, eager * (1.0 + 0.1 * r)))
        samples.append(_compile_sample("encoders", "warm", r, eager * 1.5))
        samples.append(_compile_sample("eager", "none", r, eager))
    rows = {(row["variant"], row["cache"]): row for row in compile_summarize(samples)}
    assert list(rows) == [("eager", "none"), ("encoders", "cold"), ("encoders", "warm")]  # table order
    warm = rows[("encoders", "warm")]
    assert (warm["predict_speedup_ci_low"], warm["predict_speedup_ci_high"]) == (1.5, 1.5)
    assert warm["predict_speedup_vs_eager"] == pytest.approx(1.5)  # ratio of the medians
    cold = rows[("encoders", "cold")]
    # n = 6: k = 1, the interval is [min, max] of the per-round ratios 1.0 .. 1.5
    assert (cold["predict_speedup_ci_low"], cold["predict_speedup_ci_high"]) == pytest.approx((1.0, 1.5))
    assert warm["recompiles"] == 1.0 and warm["host_peak_mib"] == 1024.0
    md = compile_markdown(list(rows.values()))
    assert "| encoders | warm | 0.50 | 1,875 [1,500, 2,250] | 1.50x [1.50, 1.50] | 1.50 | 938 [750, 1,125] |" in md
    # fewer rounds: medians, no interval, and the speedup without one
    few = compile_summarize([s for s in samples if s.round < 3])
    assert "| eager | none | 0.50 | 1,100 [n=3<6, no CI] | 1.00x | 1.50 |" in compile_markdown(few)


def test_a_cold_run_isolates_every_compiler_cache(tmp_path):
    # Before, only TORCHINDUCTOR_CACHE_DIR moved: Triton's kernel cache (~/.triton/cache on
    # CUDA) stayed shared, so later "cold" rounds were warm.
    from flows.sweeps.compile_report import compiler_cache_env

    env = compiler_cache_env(tmp_path / "c")
    assert env == {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "c" / "inductor"),
        "TRITON_CACHE_DIR": str(tmp_path / "c" / "triton"),
    }


def test_missing_figures_print_as_missing_not_nan_or_a_crash():
    # A predict-mode spec logs no train figures and (here) no recompile counts: before, the
    # recompile column was max() of an empty list (ValueError) and other cells printed "nan".
    samples = []
    for r in range(2):
        for variant, cache in (("eager", "none"), ("pools", "cold"), ("pools", "warm")):
            m = {K.STEADY_ROWS_PER_S: 1000.0, K.FIRST_CALL_SECONDS: 0.5, K.HOST_PEAK_BYTES: 2.0**30}
            samples.append(Sample(variant, r, RunSummary(f"{variant}-{cache}-{r}", m, "VALID"), cache=cache))
    md = compile_markdown(compile_summarize(samples))
    assert "nan" not in md.lower()
    assert "| eager | none | 0.50 | 1,000 [n=2<6, no CI] | 1.00x | - | - [" in md
    assert md.splitlines()[2].endswith("| - | 1,024 | - |")


def test_a_compiled_variant_slower_in_every_round_is_said_though_the_unpaired_intervals_overlap():
    # Failed before: the note compared the two unpaired intervals of the medians. The host
    # drifts from 1,000 to 1,500 rows/s over the rounds (eager's interval [1,000, 1,500]), and
    # pools (warm) runs at 0.9x eager in every round ([900, 1,350]): the intervals overlap and
    # nothing was said, though each round's pair shows it slower. The paired per-round ratio is
    # 0.9 in all six rounds: its 95% interval [0.90, 0.90] lies below 1.
    samples = []
    for r in range(6):
        eager = 1000.0 + 100 * r
        samples.append(_compile_sample("eager", "none", r, eager))
        samples.append(_compile_sample("pools", "warm", r, eager * 0.9))
        # cold: 0.95..1.05x, the paired interval holds 1: not said
        samples.append(_compile_sample("pools", "cold", r, eager * (0.95 + 0.02 * r)))
    rows = compile_summarize(samples)
    from flows.sweeps.compile_report import slower_than_eager

    notes = slower_than_eager(rows)
    assert notes == [
        "pools (warm cache) is slower than eager: its predict steady rows/s over eager's in the same round has "
        "the 95% interval [0.90x, 0.90x], wholly below 1",
        "pools (warm cache) is slower than eager: its train steady rows/s over eager's in the same round has "
        "the 95% interval [0.90x, 0.90x], wholly below 1",
    ]
    assert compile_markdown(rows).endswith("Note: " + notes[1] + ".")
    # fewer rounds than an interval needs: nothing is judged
    assert slower_than_eager(compile_summarize([s for s in samples if s.round < 5])) == []


def test_a_variant_faster_in_some_rounds_is_not_called_slower():
    # eager 1,000 flat; pools (warm) at 0.8x in five rounds and 1.2x in one: the paired
    # interval (6 rounds: [min, max]) is [0.80, 1.20], which holds 1
    samples = []
    for r in range(6):
        samples.append(_compile_sample("eager", "none", r, 1000.0))
        samples.append(_compile_sample("pools", "warm", r, 1200.0 if r == 3 else 800.0))
    from flows.sweeps.compile_report import slower_than_eager

    assert slower_than_eager(compile_summarize(samples)) == []
