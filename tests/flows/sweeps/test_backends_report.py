"""The backends report's table and chart from measured samples (no processes started)."""

from __future__ import annotations

import math

from dashboards.backends import backends_figure, summarize, to_markdown
from flows.sweeps.backends_report import VARIANTS
from tasks.measure.report import RunSummary, Sample


def sample(variant: str, r: int, steady: float, **extra: float) -> Sample:
    m = {
        "compute.steady_rows_per_s": steady,
        "e2e.predict.rows_per_s": steady / 10,
        "compute.first_call_seconds": 0.5,
        "compute.batch_ms.p99": 9.0,
        "quality.accuracy": 0.9,
        "quality.delta_vs_reference": -0.01,
        "checkpoint.bytes": 1000.0,
        "checkpoint.load_seconds": 0.02,
        "backend.model_bytes": 700.0,
        "backend.load_seconds": 0.3,
        "memory.host_peak_bytes": 2**30,
        **extra,
    }
    return Sample(variant, r, RunSummary(f"id-{variant}-{r}", m, "VALID"))


def test_every_variant_overrides_the_predict_run():
    files = {
        "fp32": "a.ckpt",
        "fp16": "a.fp16.ckpt",
        "int8": "a.int8.ckpt",
        "int4": "a.int4.ckpt",
        "fp8": "a.fp8.ckpt",
        "bundle": "b",
    }
    got = {name: make(files) for name, make in VARIANTS.items()}
    assert got["pytorch_int4"] == ["run.checkpoint=a.int4.ckpt"]
    assert "run.compile.model=true" in got["pytorch_compiled"]
    assert got["onnxruntime_int8"][-1] == "run.onnxruntime.quantization=dynamic_int8"
    assert all("run.backend=onnxruntime" in v for k, v in got.items() if k.startswith("onnxruntime"))


def test_summary_takes_medians_and_the_right_file_per_backend():
    samples = [sample("pytorch_int8", r, s) for r, s in enumerate((100.0, 300.0, 200.0))]
    samples += [sample("onnxruntime_fp32", r, 50.0 + r) for r in range(6)]
    samples.append(Sample("pytorch_compiled", 0, None))
    rows = {r["variant"]: r for r in summarize(samples, "accuracy")}
    assert rows["pytorch_int8"]["steady_rows_per_s"] == 200.0
    # 3 rounds support no 95% interval of the median; 6 do (order statistics)
    assert rows["pytorch_int8"]["steady_ci_low"] is None and rows["pytorch_int8"]["steady_ci_high"] is None
    ort = rows["onnxruntime_fp32"]
    assert (
        ort["steady_ci_low"] is not None and ort["steady_ci_low"] <= ort["steady_rows_per_s"] <= ort["steady_ci_high"]
    )
    assert rows["pytorch_int8"]["file_bytes"] == 1000.0  # the checkpoint file
    assert rows["onnxruntime_fp32"]["file_bytes"] == 700.0  # the served ONNX file
    assert rows["onnxruntime_fp32"]["load_s"] == 0.3
    assert rows["pytorch_compiled"]["validity"] == "FAILED"
    assert math.isnan(rows["pytorch_compiled"]["steady_rows_per_s"])
    md = to_markdown(list(rows.values()), "accuracy")
    assert md.count("\n") == 2 + len(rows) - 1 and "| pytorch_int8 | 0.50 | 200 [n=3<6, no CI] |" in md
    fig = backends_figure(list(rows.values()))
    assert [t.name for t in fig.data] == ["steady compute", "end-to-end predict", "accuracy delta"]
    assert list(fig.data[0].x) == list(rows)


def test_like_for_like_variants_threads_reference_and_compiler_memory():
    # Before: no padded PyTorch variant (ONNX Runtime runs the padded graph, PyTorch packed),
    # the fp16 reference's delta of 0 looked like a measurement, and a compiled variant's peak
    # held its compiler processes with nothing beside it.
    files = {"fp32": "a.ckpt", "fp16": "a.fp16.ckpt", "int8": "i", "int4": "j", "fp8": "k", "bundle": "b"}
    assert VARIANTS["pytorch_eager_fp32_padded"](files) == ["run.checkpoint=a.ckpt", "run.packing=off"]
    samples = [
        sample("pytorch_fp16", 0, 100.0, **{"quality.delta_vs_reference": 0.0}),
        sample("pytorch_compiled", 0, 120.0, **{"memory.host_peak_excluding_compiler_bytes": 2**29}),
    ]
    rows = {r["variant"]: r for r in summarize(samples, "accuracy")}
    assert rows["pytorch_compiled"]["peak_rss_mib"] == 1024.0
    assert rows["pytorch_compiled"]["peak_rss_excluding_compiler_mib"] == 512.0
    md = to_markdown(list(rows.values()), "accuracy")
    assert "| +0.0000 (is the reference) |" in md
    assert "| 1,024 | 512 |" in md and "without compiler MiB" in md


def test_onnxruntime_threads_default_to_torchs_count():
    import torch

    from tasks.backends.onnxruntime import intra_op_threads
    from tasks.spec.run import OnnxRuntime

    assert intra_op_threads(OnnxRuntime()) == torch.get_num_threads()
    assert intra_op_threads(OnnxRuntime(intra_op_threads=3)) == 3


def test_a_compiled_variant_slower_in_every_round_is_said_though_the_unpaired_intervals_overlap():
    """Failed before: the note compared the two unpaired intervals. The host drifts from 1,000
    to 1,500 steady rows/s over six rounds (eager's interval [1,000, 1,500]); compiled runs at
    0.9x eager in every round ([900, 1,350]): the intervals overlap and nothing was said. The
    paired per-round ratio is 0.9 in all six rounds: its interval [0.90, 0.90] lies below 1."""
    samples = [sample("pytorch_eager_fp32", r, 1000.0 + 100 * r) for r in range(6)]
    samples += [sample("pytorch_compiled", r, (1000.0 + 100 * r) * 0.9) for r in range(6)]
    samples += [sample("pytorch_int8", r, 500.0) for r in range(6)]  # slower, but not compiled: not this rule
    md = to_markdown(summarize(samples, "accuracy"), "accuracy")
    note = (
        "Note: pytorch_compiled is slower than pytorch_eager_fp32: its steady rows/s over "
        "pytorch_eager_fp32's in the same round has the 95% interval [0.90x, 0.90x], wholly below 1."
    )
    assert md.endswith("\n\n" + note)
    assert md.count("Note:") == 1
    # faster in one round of six (0.8x in five, 1.2x in one): the interval [0.80, 1.20] holds 1
    mixed = [sample("pytorch_eager_fp32", r, 1000.0) for r in range(6)] + [
        sample("pytorch_compiled", r, 1200.0 if r == 3 else 800.0) for r in range(6)
    ]
    assert "Note:" not in to_markdown(summarize(mixed, "accuracy"), "accuracy")
    # five rounds: no interval, not judged
    assert "Note:" not in to_markdown(summarize([s for s in samples if s.round < 5], "accuracy"), "accuracy")


def test_e2e_vs_eager_is_the_median_of_same_round_ratios():
    # The host is twice as fast in odd rounds: per round the variant is 1.9-2.1x eager, while
    # a ratio of the two medians reads 205 / 150 = 1.37 (the drift stays in it).
    eager = [100.0, 200.0, 100.0, 200.0, 100.0, 200.0]
    fast = [190.0, 420.0, 210.0, 380.0, 200.0, 400.0]  # ratios 1.9, 2.1, 2.1, 1.9, 2.0, 2.0
    samples = [sample("pytorch_eager_fp32", r, 10 * e) for r, e in enumerate(eager)]
    samples += [sample("pytorch_bf16", r, 10 * f) for r, f in enumerate(fast)]
    samples.append(Sample("onnxruntime_fp32", 0, None))  # failed: no ratio
    rows = {r["variant"]: r for r in summarize(samples, "accuracy")}
    assert rows["pytorch_bf16"]["e2e_vs_eager"] == 2.0
    assert (rows["pytorch_bf16"]["e2e_vs_eager_ci_low"], rows["pytorch_bf16"]["e2e_vs_eager_ci_high"]) == (1.9, 2.1)
    assert rows["pytorch_eager_fp32"]["e2e_vs_eager"] == 1.0
    assert math.isnan(rows["onnxruntime_fp32"]["e2e_vs_eager"])
    md = to_markdown(list(rows.values()), "accuracy")
    assert "| 2.00x [1.90, 2.10] |" in md and "e2e vs eager [95% CI]" in md
    # two rounds: a ratio, no interval
    two = [s for s in samples if s.round < 2 and s.report is not None]
    assert "| 2.00x [n=2<6, no CI] |" in to_markdown(summarize(two, "accuracy"), "accuracy")


def test_children_without_a_round_tag_pair_with_nothing():
    from dashboards.backends import ROUND_TAG, rows_from_runs
    from tasks.tracking.reader import StoredRun

    def record(variant: str, e2e: float, tags: dict[str, str], parent: str = "p") -> StoredRun:
        m = {"compute.steady_rows_per_s": e2e * 10, "e2e.predict.rows_per_s": e2e}
        tags = {"relflow.variant": variant, "mlflow.parentRunId": parent, **tags}
        return StoredRun(
            run_id=f"id-{variant}-{e2e}",
            run_name=variant,
            experiment="tpch-orders",
            status="FINISHED",
            start_time_ms=0,
            end_time_ms=1,
            metrics=m,
            params={"run.backend": "pytorch"},
            tags=tags,
        )

    old = rows_from_runs([record("pytorch_eager_fp32", 100.0, {}), record("pytorch_bf16", 300.0, {})])
    assert all(math.isnan(r["e2e_vs_eager"]) for r in old)
    new = rows_from_runs(
        [record("pytorch_eager_fp32", 100.0, {ROUND_TAG: "0"}), record("pytorch_bf16", 300.0, {ROUND_TAG: "0"})]
    )
    assert {r["variant"]: r["e2e_vs_eager"] for r in new} == {"pytorch_eager_fp32": 1.0, "pytorch_bf16": 3.0}
    # two reports in one store, each with a round 0: a round pairs runs of its own parent only
    two = rows_from_runs(
        [
            record("pytorch_eager_fp32", 100.0, {ROUND_TAG: "0"}, "p1"),
            record("pytorch_bf16", 300.0, {ROUND_TAG: "0"}, "p1"),
            record("pytorch_eager_fp32", 1000.0, {ROUND_TAG: "0"}, "p2"),
            record("pytorch_bf16", 1000.0, {ROUND_TAG: "0"}, "p2"),
        ]
    )
    assert {r["variant"]: r["e2e_vs_eager"] for r in two}["pytorch_bf16"] == 2.0  # median of 3.0 and 1.0


def test_collect_rotates_the_order_each_round_and_runs_every_variant_against_the_fp16_reference(tmp_path, monkeypatch):
    """``collect`` over 3 variants x 4 rounds, with each process launch recorded instead of
    started (a real one is a full benchmark run; tests/flows/test_benchmark_backends.py runs real
    variants): round r starts at variant r mod 3, every variant is one launch of its own in
    predict mode against the fp16 checkpoint, and its child carries its round."""
    import flows.sweeps.backends_report as br
    import flows.sweeps.launch as launch_mod
    from dashboards.backends import ROUND_TAG
    from flows.sweeps.launch import Launched
    from tasks.tracking.reader import StoredRun
    from tests.repo import DEFAULT_SPEC

    files = {"fp32": "w.ckpt", "fp16": "w.fp16.ckpt", "int8": "w.int8.ckpt", "int4": "i", "fp8": "k", "bundle": "b"}
    launches: list[dict] = []

    def recorded_launch(spec: dict, **kw) -> Launched:
        launches.append({"spec": spec, **kw})
        m = {"compute.steady_rows_per_s": 10.0, "e2e.predict.rows_per_s": 1.0, "compute.first_call_seconds": 0.1}
        return Launched(0, RunSummary(f"id-{kw['name']}", m, "VALID"), None, "")

    def stored(run_id: str, uri: str | None = None) -> StoredRun:
        return StoredRun(run_id, "n", "e", "FINISHED", 0, 1, {}, {}, {"relflow.backend": "pytorch"})

    monkeypatch.setattr(launch_mod, "launch_local", recorded_launch)
    monkeypatch.setattr("tasks.tracking.reader.get_stored_run", stored)
    variants = ["pytorch_eager_fp32", "pytorch_fp16", "pytorch_int8"]
    launch = br.Launch(DEFAULT_SPEC, ["run.batch_size=512"], "parent-id", tmp_path, "sqlite:///x.db")
    samples = br.collect(launch, 4, variants, files, lambda line: None)

    expected_order = [
        "pytorch_eager_fp32", "pytorch_fp16", "pytorch_int8",  # round 0
        "pytorch_fp16", "pytorch_int8", "pytorch_eager_fp32",  # round 1
        "pytorch_int8", "pytorch_eager_fp32", "pytorch_fp16",  # round 2
        "pytorch_eager_fp32", "pytorch_fp16", "pytorch_int8",  # round 3 (3 mod 3 = 0)
    ]  # fmt: skip
    assert [s.variant for s in samples] == expected_order
    assert [s.round for s in samples] == [r for r in range(4) for _ in variants]
    assert len(launches) == 12  # one process per variant per round
    checkpoint = {"pytorch_eager_fp32": "w.ckpt", "pytorch_fp16": "w.fp16.ckpt", "pytorch_int8": "w.int8.ckpt"}
    for i, (v, call) in enumerate(zip(expected_order, launches, strict=True)):
        r = i // 3
        assert call["name"] == f"{v}-{r}"
        assert call["tags"] == {"relflow.variant": v, ROUND_TAG: str(r)}
        assert call["parent_run_id"] == "parent-id" and call["api_url"] is None  # its own Prefect server
        run = call["spec"]["run"]
        assert run["mode"] == "predict" and run["batch_size"] == 512  # the report's overrides kept
        assert run["reference_checkpoint"] == "w.fp16.ckpt"  # every variant, fp16 itself included
        assert run["checkpoint"] == checkpoint[v]
