"""Every metric key the harness logs, spelled once.

Modules import the names (constants for fixed keys, small functions for families such as
``stage.<stage>.<phase>.seconds``); ``CATALOGUE`` documents each key or family with its
unit, and README.md's metric list is generated from it (a test checks that they agree, and
that every key a real run logs matches an entry here).
"""

from __future__ import annotations

import re

STAGES = ("retrieve", "preprocess", "tensorize", "compute", "calibrate", "write")
PHASES = ("train", "predict")
# Stages each phase runs: training epochs never write predictions.
PHASE_STAGES = {"train": STAGES[:4], "predict": STAGES}


def stage_seconds(stage: str, phase: str) -> str:
    return f"stage.{stage}.{phase}.seconds"


def stage_rows(stage: str, phase: str) -> str:
    return f"stage.{stage}.{phase}.rows"


def stage_rows_per_s(stage: str, phase: str) -> str:
    return f"stage.{stage}.{phase}.rows_per_s"


def stage_bytes(stage: str, phase: str) -> str:
    return f"stage.{stage}.{phase}.bytes"


def stage_warm_seconds(stage: str) -> str:
    """``stage.<stage>.predict.warm_seconds``: the predict passes after the first (offline)."""
    return f"stage.{stage}.predict.warm_seconds"


def stage_warm_bytes(stage: str) -> str:
    """``stage.<stage>.predict.warm_bytes``: the predict passes after the first (offline)."""
    return f"stage.{stage}.predict.warm_bytes"


def e2e(phase: str, what: str) -> str:
    """``e2e.<phase>.<what>``: seconds | rows | rows_per_s."""
    return f"e2e.{phase}.{what}"


# Headline: one retrieve..write pass over every root row.
E2E_PREDICT_SECONDS = "e2e.predict.seconds"
E2E_PREDICT_ROWS = "e2e.predict.rows"
E2E_PREDICT_ROWS_PER_S = "e2e.predict.rows_per_s"
E2E_PREDICT_PASSES = "e2e.predict.passes"
E2E_TRAIN_SECONDS = "e2e.train.seconds"
E2E_TRAIN_ROWS = "e2e.train.rows"
E2E_TRAIN_ROWS_PER_S = "e2e.train.rows_per_s"
E2E_TRAIN_EPOCHS = "e2e.train.epochs"
E2E_TRAIN_RANKS_MEAN_SECONDS = "e2e.train.ranks_mean_seconds"  # run.distributed


def compute(phase: str, what: str) -> str:
    """Compute-stage figures of one phase; plain ``compute.<what>`` are the predict ones."""
    return f"compute.{what}" if phase == "predict" else f"compute.{phase}.{what}"


def compute_phase(phase: str, what: str) -> str:
    """Always phase-qualified: ``compute.<phase>.<what>``."""
    return f"compute.{phase}.{what}"


STEADY_ROWS_PER_S = "compute.steady_rows_per_s"
TRAIN_STEADY_ROWS_PER_S = "compute.train.steady_rows_per_s"
FIRST_CALL_SECONDS = "compute.first_call_seconds"
TRAIN_UPDATES = "compute.train.updates"
TRAIN_UPDATES_PER_EPOCH = "compute.train.updates_per_epoch"
COMPILED_FRAMES = "compute.compiled_frames"
# A library's compiled regions (model.library relflow): calls that ran the compiled graph vs
# fell back to eager (the reasons are tagged relflow.library_eager_reasons).
COMPILED_REGION_CALLS = "compute.compiled_region_calls"
EAGER_REGION_CALLS = "compute.eager_region_calls"


# relflow's own ThroughputLogger (model.library relflow), beside the harness's exact figures:
# compute(phase, LIBRARY_LOGGER_STEADY_MEAN_ROWS_PER_S) etc.
LIBRARY_LOGGER_STEADY_MEAN_ROWS_PER_S = "library_logger.steady_mean_rows_per_s"
LIBRARY_LOGGER_LAST_ROWS_PER_S = "library_logger.last_rows_per_s"
LIBRARY_LOGGER_TRAIN_LAST_LOSS = "compute.train.library_logger.last_loss"
# model.library relational_transformers collates each batch as it is served, inside compute's
# wait for input: compute(phase, LIBRARY_COLLATE_SECONDS)
LIBRARY_COLLATE_SECONDS = "library_collate_seconds"
COMPILE_CACHE_HITS = "compute.compile_cache_hits"
COMPILE_CACHE_MISSES = "compute.compile_cache_misses"
# compute(phase, ESTIMATED_ROWS_PER_S): logged by the model's throughput callback itself
# (model.throughput.ThroughputCallback), not by RunResult.metrics().
ESTIMATED_ROWS_PER_S = "estimated_rows_per_s"


# Repeat statistics (tasks/measure/stats.py): the median of per-pass samples and its interval.
def median(key: str) -> str:
    return f"{key}.median"


def median_ci_low(key: str) -> str:
    return f"{key}.median_ci_low"


def median_ci_high(key: str) -> str:
    return f"{key}.median_ci_high"


def median_ci_level(key: str) -> str:
    return f"{key}.median_ci_level"


REPEATS_MEASURED = "run.repeats_measured"
# The run's projected duration (tasks/measure/projection.py), made after its first steady batches.
RUN_PROJECTED_SECONDS = "run.projected_seconds"
RUN_PROJECTED_AT_SECONDS = "run.projected_at_seconds"
RUN_PROJECTED_EXACT = "run.projected_exact"
RUN_REPROJECTED_SECONDS = "run.reprojected_seconds"

DATA_ROOT_ROWS = "data.root_rows"
DATA_ROWS_PREDICTED = "data.rows_predicted"
DATA_ROWS_WRITTEN = "data.rows_written"
DATA_BYTES_READ = "data.bytes_read"
DATA_COORDS_PRESENT = "data.coords_present"
DATA_COORDS_RESERVED = "data.coords_reserved"
DATA_OCCUPANCY = "data.occupancy"
DATA_OVERFLOW_DROPPED = "data.overflow_dropped"
DATA_CHUNKS = "data.chunks"
DATA_ROWS_READ = "data.rows_read"
SERVER_PEAK_QPS = "server.peak_qps"
SERVER_PEAK_QPS_BRACKET_LOW = "server.peak_qps_bracket_low"
SERVER_PEAK_QPS_BRACKET_HIGH = "server.peak_qps_bracket_high"
SERVER_PEAK_PROBES = "server.peak_probes"
DATA_PADDED_COORDS = "data.padded_coords"
DATA_BATCH_OCCUPANCY_P50 = "data.batch_occupancy.p50"
DATA_BATCH_OCCUPANCY_MIN = "data.batch_occupancy.min"
DATA_BATCH_SHAPES = "data.batch_shapes"
DATA_TEXT_CELLS = "data.text_cells"
ENCODE_CELLS_PER_S = "encode.cells_per_s"
# relational-transformers' encode step vectorises each distinct string and column name of a
# chunk once, not each cell: its own keys, never data.text_cells / encode.cells_per_s
DATA_STRINGS_ENCODED = "data.strings_encoded"
ENCODE_STRINGS_PER_S = "encode.strings_per_s"
# relational-transformers' text through relational-transformers-utils' CachedEncoder
# (model.rt.context.builder rt_utils): distinct strings asked for that were / were not cached
ENCODE_TEXT_CACHE_HITS = "encode.text_cache_hits"
ENCODE_TEXT_CACHE_MISSES = "encode.text_cache_misses"
# model.rt.context.builder rt_utils (tasks/libraries/relational_transformers/graph_contexts.py):
# the encode step's seconds by bucket, summed over every encode call of the run, and the contexts
RT_CONTEXT_STORE_SECONDS = "rt.context.store_seconds"
RT_CONTEXT_ASSEMBLY_SECONDS = "rt.context.assembly_seconds"
RT_CONTEXT_CELLS_SECONDS = "rt.context.cells_seconds"
RT_CONTEXT_TEXT_SECONDS = "rt.context.text_seconds"
RT_CONTEXT_CONTEXTS = "rt.context.contexts"
RT_CONTEXT_BUDGET_FULL = "rt.context.budget_full"
RT_CONTEXT_FUTURE_CELLS_DROPPED = "rt.context.future_cells_dropped"
RT_CONTEXT_LABEL_CELLS_WITHHELD = "rt.context.label_cells_withheld"
RT_CONTEXT_CELLS_MEAN = "rt.context.cells_mean"
RT_CONTEXT_CELLS_P50 = "rt.context.cells_p50"
RT_CONTEXT_CELLS_MAX = "rt.context.cells_max"


def overflow_dropped(branch: str) -> str:
    return f"{DATA_OVERFLOW_DROPPED}.{branch}"


# Data checks before any work (tasks/run/checks/data.py) and the memory budget (tasks/run/checks/memory_budget.py).
DATA_DUPLICATE_ROOT_KEYS = "data.duplicate_root_keys"
DATA_LABELLED_ROWS = "data.labelled_rows"
MEMORY_ESTIMATED_CHUNK_BYTES = "memory.estimated_chunk_bytes"
MEMORY_BUDGET_BYTES = "memory.budget_bytes"


def orphan_rows(branch: str) -> str:
    return f"data.orphan_rows.{branch}"


def roots_without_rows(branch: str) -> str:
    return f"data.roots_without_rows.{branch}"


def observed_max_rows(branch: str) -> str:
    return f"data.observed_max_rows.{branch}"


def reserved_rows(branch: str) -> str:
    return f"data.reserved_rows.{branch}"


def non_finite(table: str, column: str) -> str:
    return f"data.non_finite.{table}.{column}"


INPUT_WAIT_FRACTION = "device.input_wait_fraction"
WORKER_STARTUP_SECONDS = "device.worker_startup_seconds"
HOST_PEAK_BYTES = "memory.host_peak_bytes"
HOST_PEAK_EXCLUDING_COMPILER_BYTES = "memory.host_peak_excluding_compiler_bytes"
DEVICE_PEAK_BYTES = "memory.device_peak_bytes"
OUTPUT_BYTES = "output.bytes"
OUTPUT_BYTES_PER_ROW = "output.bytes_per_row"


def quality(name: str) -> str:
    return f"quality.{name}"


QUALITY_ROWS = "quality.rows"
# category: scored rows whose class the model never learned (counted wrong, tasks/measure/quality.py)
QUALITY_UNSEEN_CLASS_ROWS = "quality.unseen_class_rows"
# The headline quality's bootstrap interval over the scored rows (tasks/measure/quality.py
# ``Quality.interval``): ``quality.<name>.ci_low|ci_high``.
QUALITY_CI_BOUNDS = ("ci_low", "ci_high")


def quality_ci_name(name: str, bound: str) -> str:
    """The ``Quality`` figure name of an interval bound (``auc.ci_low``); logged under ``quality.``."""
    return f"{name}.{bound}"


def quality_ci(name: str, bound: str) -> str:
    """``quality.<name>.ci_low|ci_high``: a bound of the headline ``quality.<name>``'s interval."""
    return quality(quality_ci_name(name, bound))


# Temperature scaling fits on one half of the held-out rows and reports quality.nll|ece|brier
# on the other (tasks/stages/split.py): both counts are published.
CALIBRATION_FIT_ROWS = "calibration.fit_rows"
CALIBRATION_FIT_ERRORS = "calibration.fit_errors"  # fit rows with a wrong top class
CALIBRATION_TEMPERATURE = "calibration.temperature"  # T the served logits are divided by
CALIBRATION_FIT_SECONDS = "calibration.fit_seconds"  # the fit itself (within harness.calibration_fit_seconds)
CALIBRATION_REPORT_ROWS = "calibration.report_rows"
# The headline quality of each task kind (``quality.<name>``): the one figure run notes,
# sweeps, reports and dashboards show for a run's quality.
HEADLINE_QUALITY = {"category": "accuracy", "binary": "auc", "regression": "mae"}

HARNESS_DATA_SECONDS = "harness.data_seconds"
HARNESS_STARTUP_SECONDS = "harness.startup_seconds"
HARNESS_MLFLOW_STARTUP_SECONDS = "harness.mlflow_startup_seconds"
HARNESS_ORCHESTRATION_SECONDS = "harness.orchestration_seconds"
HARNESS_ENGINE_SETUP_SECONDS = "harness.engine_setup_seconds"
# The timed region split into named buckets that add up to it exactly (tasks/run/scenarios/region.py).
HARNESS_REGION_SECONDS = "harness.region_seconds"
HARNESS_STAGE_SECONDS = "harness.stage_seconds"
HARNESS_BACKEND_SETUP_SECONDS = "harness.backend_setup_seconds"
HARNESS_CALIBRATION_FIT_SECONDS = "harness.calibration_fit_seconds"
HARNESS_REQUEST_WAIT_SECONDS = "harness.request_wait_seconds"
HARNESS_REQUEST_SETTLE_SECONDS = "harness.request_settle_seconds"
HARNESS_DISTRIBUTED_LAUNCH_SECONDS = "harness.distributed_launch_seconds"
HARNESS_LOCK_WAIT_SECONDS = "harness.lock_wait_seconds"
HARNESS_REGION_GC_SECONDS = "harness.region_gc_seconds"
HARNESS_REGION_GC_COLLECTIONS = "harness.region_gc_collections"
HARNESS_REGION_START = "harness.timed_region_start_unix_s"
HARNESS_REGION_END = "harness.timed_region_end_unix_s"
HARNESS_FLOW_SECONDS = "harness.flow_seconds"
HARNESS_FLOW_OVERHEAD_SECONDS = "harness.flow_overhead_seconds"
# Request traces (tasks/tracking/traces.py), logged after the timed region.
HARNESS_TRACE_LOGGING_SECONDS = "harness.trace_logging_seconds"
HARNESS_TRACE_LOGGING_SECONDS_PER_TRACE = "harness.trace_logging_seconds_per_trace"
REQUESTS_TRACES_LOGGED = "requests.traces_logged"

HOST_PEAK_FLOPS_PER_S = "host.peak_flops_per_s"
TRAIN_RANK_PEAK_FLOPS_PER_S = "compute.train.rank_peak_flops_per_s"
PREDICT_REQUEST_PEAK_FLOPS_PER_S = "compute.predict.request_peak_flops_per_s"
PREDICT_INTRA_OP_THREADS = "compute.predict.intra_op_threads"
HOST_PEAK_CACHED = "host.peak_cached"
MFU = "mfu"  # compute(phase, MFU)
MODEL_FLOPS_PER_S = "model_flops_per_s"  # compute(phase, MODEL_FLOPS_PER_S)
MFU_RESERVED = "mfu_reserved"  # compute(phase, MFU_RESERVED): over the schema's reserved shape
MODEL_FLOPS_PER_S_RESERVED = "model_flops_per_s_reserved"  # compute(phase, ...)


# Distributed training (run.distributed, tasks/run/distributed/launch.py); rank 0 logs them.
def ddp_rank_rows_per_s(rank: int) -> str:
    return f"compute.train.rank{rank}.rows_per_s"


def ddp_rank_rows_read(rank: int) -> str:
    return f"data.train.rank{rank}.rows_read"


DDP_TOTAL_ROWS_PER_S = "compute.train.total_rows_per_s"
DDP_ALLREDUCE_SECONDS = "compute.train.allreduce_seconds"
DDP_ALLREDUCE_FRACTION = "compute.train.allreduce_fraction"
DDP_PROCESSES = "compute.train.processes"
DDP_THREADS_PER_PROCESS = "compute.train.threads_per_process"
DDP_REFERENCE_ROWS_PER_S = "compute.train.reference_rows_per_s"
DDP_SCALING_EFFICIENCY = "compute.train.scaling_efficiency"

# Deployment backends (tasks/backends/, run.backend, quantized checkpoints).
CHECKPOINT_BYTES = "checkpoint.bytes"
CHECKPOINT_LOAD_SECONDS = "checkpoint.load_seconds"
HOST_AFTER_LOAD_BYTES = "memory.host_after_load_bytes"
MODEL_BYTES_AFTER_LOAD = "memory.model_bytes_after_load"
MODEL_BYTES_FP32 = "memory.model_bytes_fp32"
EXPORT_SECONDS = "export.seconds"
EXPORT_BYTES = "export.bytes"
EXPORT_QUANTIZE_SECONDS = "export.quantize_seconds"
BACKEND_LOAD_SECONDS = "backend.load_seconds"
BACKEND_MODEL_BYTES = "backend.model_bytes"
BACKEND_FP8_FALLBACK_CALLS = "backend.fp8_fallback_calls"
GRAPH_BREAKS_WARMUP = "graph_breaks_warmup"  # compute(phase, GRAPH_BREAKS_WARMUP)
QUALITY_DELTA_VS_REFERENCE = "quality.delta_vs_reference"
# Request scenarios: the same steady rows over two different times (tasks/run/scenarios/latency.py).
LATENCY_ROWS_PER_SERVICE_S = "latency.rows_per_service_s"
LATENCY_ROWS_PER_WALL_S = "latency.rows_per_wall_s"
LATENCY_SERVICE_SECONDS = "latency.service_seconds"
LATENCY_INTRA_OP_THREADS = "latency.intra_op_threads"
# server: the lowest bound LoadGen's server rule passes (tasks/run/scenarios/early_stopping.py).
LATENCY_P99_SERVER_RULE = "latency.request_ms.p99_server_rule"
# The rest of a request scenario's record (tasks/run/scenarios/latency.py; CATALOGUE's latency.<what>).
LATENCY_PREFIX = "latency."  # every request-scenario key starts so
LATENCY_REQUESTS = "latency.requests"
LATENCY_ROOTS_PER_REQUEST = "latency.roots_per_request"
LATENCY_DURATION_SECONDS = "latency.duration_seconds"
LATENCY_FIRST_REQUEST_MS = "latency.first_request_ms"
LATENCY_REQUEST_MS_MAX = "latency.request_ms.max"
LATENCY_REQUEST_MS_MEAN = "latency.request_ms.mean"
LATENCY_STEP_SHARE_QUEUE = "latency.step_share.queue"
LATENCY_STEP_SHARE_OTHER = "latency.step_share.other"
LATENCY_QUEUE_MS_P50 = "latency.queue_ms.p50"
LATENCY_QUEUE_MS_P99 = "latency.queue_ms.p99"
LATENCY_ISSUE_LATENESS_MS_P50 = "latency.issue_lateness_ms.p50"
LATENCY_ISSUE_LATENESS_MS_P99 = "latency.issue_lateness_ms.p99"
LATENCY_ISSUE_LATENESS_MS_MAX = "latency.issue_lateness_ms.max"
LATENCY_ACHIEVED_QPS = "latency.achieved_qps"
LATENCY_TARGET_QPS = "latency.target_qps"
LATENCY_BATCH_REQUESTS_MEAN = "latency.batch_requests.mean"
LATENCY_BATCH_REQUESTS_MAX = "latency.batch_requests.max"
LATENCY_CDF_MS = "latency.cdf_ms"  # a series: step q (0..100) is percentile q, in ms


def latency_request_ms(q: int) -> str:
    """``latency.request_ms.p<q>``: nearest-rank percentile ``q`` of the steady requests."""
    return f"latency.request_ms.p{q}"


def latency_early_stopping(q: int) -> str:
    """``latency.request_ms.p<q>_early_stopping``: LoadGen's early-stopping estimate."""
    return f"latency.request_ms.p{q}_early_stopping"


def latency_first_request_step_ms(step: str) -> str:
    return f"latency.first_request.step_ms.{step}"


def latency_step_ms_mean(step: str) -> str:
    return f"latency.step_ms.{step}.mean"


def latency_step_share(step: str) -> str:
    """``latency.step_share.<step>`` (also ``queue`` and ``other``: LATENCY_STEP_SHARE_*)."""
    return f"latency.step_share.{step}"


QUALITY_DROP_VS_REFERENCE = "quality.drop_vs_reference"
# Request scenarios: served outputs vs an offline pass over the same keys, and repeated keys
# (tasks/run/scenarios/outputs.py).
REQUESTS_OUTPUTS_MAX_ABS_DIFF = "requests.outputs_max_abs_diff"
REQUESTS_OUTPUTS_MISMATCHED_ROOTS = "requests.outputs_mismatched_roots"
REQUESTS_OUTPUTS_ROOTS_CHECKED = "requests.outputs_roots_checked"
REQUESTS_OUTPUTS_TOLERANCE = "requests.outputs_tolerance"
REQUESTS_REPEAT_KEY_SPEEDUP = "requests.repeat_key_speedup"
REQUESTS_REPEAT_KEYS = "requests.repeat_keys"
# run.check_outputs (offline): the last pass vs a plain pass (no bucketing, padded, eager).
PREDICT_OUTPUTS_MAX_ABS_DIFF = "predict.outputs_max_abs_diff"
PREDICT_OUTPUTS_MISMATCHED_ROOTS = "predict.outputs_mismatched_roots"
PREDICT_OUTPUTS_ROOTS_CHECKED = "predict.outputs_roots_checked"
PREDICT_OUTPUTS_TOLERANCE = "predict.outputs_tolerance"


def noise(metric: str, what: str) -> str:
    """``noise.<metric>.<what>`` on a ``relflow-bench noise`` parent run: cv | mde."""
    return f"noise.{metric}.{what}"


NOISE_RUNS = "noise.runs"
# Headline figures whose between-run noise ``relflow-bench noise`` reports.
NOISE_METRICS = (E2E_PREDICT_ROWS_PER_S, STEADY_ROWS_PER_S, TRAIN_STEADY_ROWS_PER_S)

# relflow-bench budget (flows/sweeps/budget.py): per context size, logged on each point's child run.
BUDGET_MS_PER_PREDICTION = "budget.ms_per_prediction"
BUDGET_CELLS_PRESENT_PER_PREDICTION = "budget.cells_present_per_prediction"
BUDGET_CELLS_PADDED_PER_PREDICTION = "budget.cells_padded_per_prediction"
BUDGET_ON_FRONT = "budget.on_front"
BUDGET_DOMINATED_BY = "budget.dominated_by"
BUDGET_POINTS = "budget.points"  # on the budget's parent run
BUDGET_FRONT_POINTS = "budget.front_points"


def budget_stage_ms(stage: str) -> str:
    """``budget.stage.<stage>.ms_per_prediction``: one stage's predict milliseconds per prediction."""
    return f"budget.stage.{stage}.ms_per_prediction"


def relbench(metric: str) -> str:
    """RelBench's own figure for a time-anchored task (``relbench.<metric>``: roc_auc, nmae, ...)."""
    return f"relbench.{metric}"


def relbench_ci(metric: str, bound: str) -> str:
    """``relbench.<metric>.ci_low|ci_high``: a bound of ``relbench.<metric>``'s bootstrap interval
    over the test entities (tasks/run/record/relbench_scores.py; ``bound`` from QUALITY_CI_BOUNDS)."""
    return f"{relbench(metric)}.{bound}"


BASELINES = ("train_mean", "previous")


def quality_baseline(baseline: str, metric: str) -> str:
    """A baseline's RelBench figure on the same test rows (tasks/run/record/relbench_scores.py)."""
    return f"quality.baseline.{baseline}.{metric}"


RELBENCH_TEST_ROWS = "relbench.test_rows"
RELBENCH_TASK_ROWS_SECONDS = "relbench.task_rows_seconds"


def quality_reference(name: str) -> str:
    """The reference checkpoint's held-out ``quality.<name>`` (run.reference_checkpoint)."""
    return f"quality.reference.{name}"


# The floor ledger (tasks/run/floors.py): each stage against the plainest way to do its work.
FLOOR_STAGES = ("retrieve", "preprocess", "tensorize", "compute", "write", "orchestration")
FLOOR_UNITS = {
    "retrieve": "bytes_per_s",
    "preprocess": "rows_per_s",  # time-anchored roots only: the as-of join (tasks/run/floors.py)
    "tensorize": "bytes_per_s",
    "compute": "flops_per_s",
    "write": "bytes_per_s",
    "orchestration": "calls_per_s",
}


def floor_fraction(stage: str) -> str:
    """``floor.<stage>.fraction``: the stage's own rate over its floor's (1.0 = at the floor)."""
    return f"floor.{stage}.fraction"


def floor_rate(stage: str) -> str:
    """``floor.<stage>.<unit>``: the floor's rate, in the stage's unit."""
    return f"floor.{stage}.{FLOOR_UNITS[stage]}"


FLOOR_PREPROCESS_INPUT_BYTES_PER_S = "floor.preprocess.input_bytes_per_s"
FLOOR_PREPROCESS_SHARE = "floor.preprocess.share"
FLOOR_CACHED = "floor.cached"
FLOOR_OTHER_CPU_FRACTION = "floor.other_cpu_fraction"

HOST_LOAD_PER_CORE_START = "host.load_per_core_start"
HOST_OTHER_CPU_FRACTION_BEFORE = "host.other_cpu_fraction_before"
HOST_OTHER_CPU_FRACTION = "host.other_cpu_fraction"
HOST_STEAL_FRACTION = "host.steal_fraction"

# (key or family, meaning with unit). ``<stage>``, ``<phase>``, ``<what>``, ``<key>``,
# ``<branch>``, ``<name>`` and ``<q>`` are placeholders; README lists exactly these.
CATALOGUE: tuple[tuple[str, str], ...] = (
    (NOISE_RUNS, "relflow-bench noise: fresh-process runs of the one configuration that finished"),
    (
        "noise.<metric>.cv",
        "relflow-bench noise: between-run CV (sample std / mean) of <metric> (e2e.predict.rows_per_s, "
        "compute.steady_rows_per_s, compute.train.steady_rows_per_s) over noise.runs runs, of the sample "
        "compare tests (a run's median over passes 1..N-1 when logged, else its figure)",
    ),
    (
        "noise.<metric>.mde",
        "relflow-bench noise: minimum detectable effect of <metric>, a relative change (0.10 = 10%): the "
        "shift compare's rank test (Mann-Whitney U at Holm's first step over the metrics it tests) finds "
        "with 80% power between two groups of noise.runs runs; not logged where such groups can mark "
        "nothing (2-3 runs; 4 with 2+ metrics tested; 5 with 7+)",
    ),
    (
        BUDGET_MS_PER_PREDICTION,
        "relflow-bench budget, on each point's child run: end-to-end predict milliseconds per prediction "
        "(1000 x e2e.predict.seconds / e2e.predict.rows); the cost axis of its Pareto front",
    ),
    (
        "budget.stage.<stage>.ms_per_prediction",
        "relflow-bench budget: one stage's predict milliseconds per prediction (1000 x "
        "stage.<stage>.predict.seconds / e2e.predict.rows)",
    ),
    (
        BUDGET_CELLS_PRESENT_PER_PREDICTION,
        "relflow-bench budget: present cells per prediction (data.coords_present / data.rows_predicted)",
    ),
    (
        BUDGET_CELLS_PADDED_PER_PREDICTION,
        "relflow-bench budget: cells the predict batches materialised per prediction, padding included "
        "(data.padded_coords / data.rows_predicted)",
    ),
    (
        BUDGET_ON_FRONT,
        "relflow-bench budget: 1 when the point is on the Pareto front (quality up, cost down; points whose "
        "quality intervals overlap are not ranked against each other: tasks/measure/pareto.py), 0 when "
        "dominated; absent for a point without quality or cost",
    ),
    (BUDGET_DOMINATED_BY, "relflow-bench budget: how many points dominate this one (0 on the front)"),
    (BUDGET_POINTS, "relflow-bench budget, on its parent run: context sizes in the grid"),
    (BUDGET_FRONT_POINTS, "relflow-bench budget, on its parent run: points on the Pareto front"),
    (
        "stage.<stage>.<phase>.seconds",
        "seconds in one stage, summed over chunks and over the phase's "
        "epochs (train) or passes (predict); train has no write stage. run.distributed train: the "
        "slowest rank's seconds (the rank with the largest retrieve..compute total), so the stages add up "
        "to e2e.train.seconds",
    ),
    (
        "stage.<stage>.<phase>.rows",
        "root rows through the stage in that phase (train: training rows "
        "for compute, all chunk rows for the data stages; run.distributed: every rank's rows)",
    ),
    ("stage.<stage>.<phase>.rows_per_s", "rows / seconds of that stage in that phase"),
    (
        E2E_PREDICT_SECONDS,
        "headline: seconds of the predict passes, retrieve..write (root-key listing included, once); request "
        "scenarios: the step seconds of every served call, cold included (service time, not the scenario's "
        "wall time: see latency.rows_per_service_s and latency.rows_per_wall_s)",
    ),
    (E2E_PREDICT_ROWS, "root rows predicted, summed over passes"),
    (
        E2E_PREDICT_ROWS_PER_S,
        "headline of an offline run: e2e.predict.rows / e2e.predict.seconds. Request scenarios: rows per "
        "second of service time (the steps' seconds of every served call, the cold first call included; "
        "neither the waits between requests nor queueing), not a throughput: compare and history judge "
        "request runs by their latency figures (latency.request_ms.p50|p99) instead",
    ),
    (E2E_PREDICT_PASSES, "predict passes measured (run.repeats)"),
    (
        E2E_TRAIN_SECONDS,
        "seconds of the training epochs, retrieve..compute (run.distributed: the slowest rank's total)",
    ),
    (E2E_TRAIN_ROWS, "training rows through the compute stage, summed over epochs"),
    (E2E_TRAIN_ROWS_PER_S, "e2e.train.rows / e2e.train.seconds (trained rows per second)"),
    (E2E_TRAIN_EPOCHS, "training epochs run"),
    (
        E2E_TRAIN_RANKS_MEAN_SECONDS,
        "run.distributed: the ranks' mean retrieve..compute seconds (e2e.train.seconds is the slowest rank's)",
    ),
    (
        "<key>.median",
        "median over predict passes after the first (pass 0 holds the first call) of e2e.predict.rows_per_s or "
        "compute.steady_rows_per_s (run.repeats >= 3); spread inside one process, never a significance test",
    ),
    (
        "<key>.median_ci_low",
        "low end of the order-statistic interval for that median (only with run.repeats >= 7; tag relflow.ci_method)",
    ),
    ("<key>.median_ci_high", "high end of the same interval"),
    ("<key>.median_ci_level", "exact coverage of that interval (>= 0.95)"),
    (REPEATS_MEASURED, "predict passes in the repeat statistics: every pass after the first (run.repeats - 1)"),
    (
        RUN_PROJECTED_SECONDS,
        "the timed region's projected seconds (compare harness.region_seconds), made after the run's first steady "
        "batches (training's, else predict's, else a request run's first steady requests): the seconds so far plus, "
        "for every phase left, its batches left x its mean steady batch seconds and its root rows left x its other "
        "stages' seconds per row (predict before it runs: at training's, an over-estimate of compute; a request "
        "run: at least its schedule's duration); the calibration fit and backend set-up are not priced; "
        "run.max_minutes stops the run when it is over (tasks/measure/projection.py)",
    ),
    (RUN_PROJECTED_AT_SECONDS, "timed-region seconds at which run.projected_seconds was made"),
    (
        RUN_PROJECTED_EXACT,
        "1 when every count run.projected_seconds used was exact, 0 when one was an estimate (a training epoch's "
        "batches before every chunk was split into training and held-out rows)",
    ),
    (
        RUN_REPROJECTED_SECONDS,
        "the last re-projection of the timed region (made at the predict phase's or request run's own first "
        "steady batches, priced by them); absent when only one projection was made",
    ),
    ("compute.<what>", "predict-phase compute figures (same as compute.predict.<what>)"),
    (
        "compute.predict.<what>",
        "predict compute: first_call_seconds, compile_overhead_seconds, "
        "steady_rows_per_s, steady_batches, steady_seconds, batch_ms.p50|p95|p99, "
        "steady_batch_ms.cv (CV of the steady window's full-size batch times: the run's own noise floor), recompiles, "
        "graph_breaks, graph_breaks_warmup (breaks counted from the first call on, warm-up included)",
    ),
    ("compute.train.<what>", "the same for training, plus updates and updates_per_epoch"),
    (
        "compute.train.rank<r>.rows_per_s",
        "run.distributed: steady trained rows/s of rank <r> (its per-rank batches of run.batch_size / processes)",
    ),
    (
        "data.train.rank<r>.rows_read",
        "run.distributed: source rows (root and branches, every epoch) rank <r> read from the run's "
        "source (files or source.database, as the flow reads them)",
    ),
    (DDP_TOTAL_ROWS_PER_S, "run.distributed: sum of the ranks' steady trained rows/s"),
    (
        DDP_ALLREDUCE_SECONDS,
        "run.distributed: rank 0's seconds from each gradient bucket's all-reduce "
        "launch to its completion (overlaps backward)",
    ),
    (DDP_ALLREDUCE_FRACTION, "run.distributed: compute.train.allreduce_seconds / rank 0's train step seconds (0..1)"),
    (DDP_PROCESSES, "run.distributed: training processes (ranks)"),
    (DDP_THREADS_PER_PROCESS, "run.distributed: torch threads in every rank"),
    (
        DDP_REFERENCE_ROWS_PER_S,
        "run.distributed: steady trained rows/s of a 1-process run timed in the "
        "same flow just before (run.distributed.reference)",
    ),
    (
        DDP_SCALING_EFFICIENCY,
        "run.distributed: total_rows_per_s / (processes x reference_rows_per_s) (1.0 = linear scaling)",
    ),
    (
        "compute.estimated_rows_per_s",
        "the model's throughput callback (logged by the callback): "
        "steady batches x run.batch_size / their seconds, so a partial last batch is over-counted "
        "(the exact figure is compute.steady_rows_per_s); also compute.train.estimated_rows_per_s",
    ),
    (COMPILED_FRAMES, "frames Dynamo compiled during the run (all phases, warm-up included)"),
    (
        COMPILED_REGION_CALLS,
        "model.library relflow with run.compile.encoders/pools: region calls (all phases) that ran "
        "relflow's compiled graph",
    ),
    (
        compute("predict", LIBRARY_LOGGER_STEADY_MEAN_ROWS_PER_S),
        "model.library relflow: the mean, over the steady predict batches (those behind "
        "compute.steady_rows_per_s), of relflow's own ThroughputLogger figure: each batch's own rows / "
        "its batch-hook seconds (relflow's throughput/predict), a mean of per-batch rates, not rows / seconds",
    ),
    (
        compute("train", LIBRARY_LOGGER_STEADY_MEAN_ROWS_PER_S),
        "the same over the steady training batches (relflow's throughput/train; beside "
        "compute.train.steady_rows_per_s)",
    ),
    (
        compute("predict", LIBRARY_LOGGER_LAST_ROWS_PER_S),
        "model.library relflow: relflow's ThroughputLogger figure (rows/s) for the last timed predict batch, "
        "the one Lightning's callback_metrics keeps (a chunk's partial last batch where there is one)",
    ),
    (compute("train", LIBRARY_LOGGER_LAST_ROWS_PER_S), "the same for the last timed training batch"),
    (
        compute("predict", LIBRARY_COLLATE_SECONDS),
        "model.library relational_transformers: seconds collating the library's RelationalBatch of each "
        "predict batch of the run's chunks as it was served (inside the compute stage, in its wait for input: "
        "device.input_wait_fraction); the tensorize stage plans the batches only",
    ),
    (compute("train", LIBRARY_COLLATE_SECONDS), "the same for the training batches"),
    (
        LIBRARY_LOGGER_TRAIN_LAST_LOSS,
        "model.library relflow: the training loss relflow's training_step returned for the last timed "
        "training batch (relflow's loss/train; its objective's units)",
    ),
    (
        EAGER_REGION_CALLS,
        "model.library relflow with run.compile.encoders/pools: region calls that fell back to eager "
        "(reasons and counts in tag relflow.library_eager_reasons, e.g. packing=N; force_eager=N: calls of "
        "the compiled path under torch.compiler.set_stance('force_eager'), the calibration fit's)",
    ),
    (
        COMPILE_CACHE_HITS,
        "graphs the run's compiles took from the compiler's on-disk caches (Inductor FX-graph and "
        "AOTAutograd hits, all phases): above 0, first_call_seconds holds no cold compile of them "
        "(tag relflow.compiler_cache: cold, warm, mixed or none)",
    ),
    (COMPILE_CACHE_MISSES, "graphs the run's compiles built from scratch (FX-graph and AOTAutograd misses)"),
    (
        "compute.model_flops_per_s",
        "predict model FLOP/s of the coordinates present: forward FLOPs of the steady batches' root "
        "rows, each at its own shape (branches cut to its longest present instance), / their seconds",
    ),
    (
        "compute.mfu",
        "model FLOPs utilisation of the present coordinates: compute.model_flops_per_s / "
        "host.peak_flops_per_s (above 1: INVALID)",
    ),
    (
        "compute.model_flops_per_s_reserved",
        "predict FLOP/s over the schema's reserved shape (packing off) x compute.steady_rows_per_s",
    ),
    (
        "compute.mfu_reserved",
        "compute.model_flops_per_s_reserved / host.peak_flops_per_s: inflated ~1/occupancy by "
        "packing and bucketing (above 1: INVALID)",
    ),
    ("compute.train.model_flops_per_s", "the same for training, counted as 3x forward FLOPs per row"),
    ("compute.train.mfu", "compute.train.model_flops_per_s / host.peak_flops_per_s (above 1: INVALID)"),
    ("compute.train.model_flops_per_s_reserved", "compute.model_flops_per_s_reserved for training (3x forward)"),
    ("compute.train.mfu_reserved", "compute.train.model_flops_per_s_reserved / host.peak_flops_per_s"),
    (
        HOST_PEAK_FLOPS_PER_S,
        "the host's peak: best rate of a dense n x n x n matmul on the run's device, "
        "precision and thread count, cached per host fingerprint (relflow-bench peak)",
    ),
    (
        TRAIN_RANK_PEAK_FLOPS_PER_S,
        "DDP runs: the peak at a rank's torch thread count (run.distributed.threads_per_process), "
        "the denominator of compute.train.mfu|mfu_reserved there instead of host.peak_flops_per_s",
    ),
    (
        PREDICT_REQUEST_PEAK_FLOPS_PER_S,
        "the peak at the thread count the predict compute ran at (compute.predict.intra_op_threads) when it "
        "was not simply the process's: request runs (run.request.intra_op_threads) and ONNX Runtime sessions "
        "(their own count, any scenario); the denominator of compute.mfu|mfu_reserved (predict) there "
        "instead of host.peak_flops_per_s",
    ),
    (
        PREDICT_INTRA_OP_THREADS,
        "intra-op threads the predict compute ran at, the count of its MFU peak and of the floor ledger: an "
        "ONNX Runtime session's own, fixed when it was created (tag relflow.onnxruntime.intra_op_threads; "
        "a request run's torch count does not change it), else torch's while predicting "
        "(request runs: latency.intra_op_threads; offline: the process's)",
    ),
    (HOST_PEAK_CACHED, "1 when the peak came from the cache, 0 when measured in this run (after the timed region)"),
    (DATA_ROOT_ROWS, "distinct root rows of the workload"),
    (DATA_ROWS_PREDICTED, "root rows predicted, summed over passes"),
    (DATA_ROWS_WRITTEN, "rows in the kept prediction file"),
    (DATA_BYTES_READ, "bytes read from the sources"),
    (DATA_COORDS_PRESENT, "present (row, column) coordinates"),
    (
        DATA_COORDS_RESERVED,
        "reserved coordinates (padded layout); absent for a model with no reserved layout "
        "(relational-transformers pads each batch to its own longest context: data.padded_coords)",
    ),
    (DATA_OCCUPANCY, "present / reserved (absent where data.coords_reserved is)"),
    (DATA_OVERFLOW_DROPPED, "branch rows dropped by max_length, all branches"),
    ("data.overflow_dropped.<branch>", "the same for one branch"),
    (DATA_CHUNKS, "retrieve..write chunks (run.chunk_rows)"),
    (DATA_DUPLICATE_ROOT_KEYS, "root rows whose key another root row has (checked before the run; > 0 is refused)"),
    ("data.orphan_rows.<branch>", "rows of the branch whose parent key matches no parent row (ignored)"),
    ("data.roots_without_rows.<branch>", "parent rows with no row in the branch, at any depth"),
    (
        "data.non_finite.<table>.<column>",
        "NaN and +-inf values in a floating-point input (or regression target), counted before "
        "the run; NaN is read as null, infinities are refused",
    ),
    (DATA_LABELLED_ROWS, "target rows with a label (train+predict)"),
    ("data.observed_max_rows.<branch>", "the data's maximum rows per parent row in the branch"),
    ("data.reserved_rows.<branch>", "rows the run reserves per parent: min(max_length, observed maximum)"),
    (
        MEMORY_ESTIMATED_CHUNK_BYTES,
        "estimated bytes of one chunk (encoded tensors, one batch's activations and attention "
        "scores), from the reserved shape before any work",
    ),
    (MEMORY_BUDGET_BYTES, "the budget the estimate was checked against (run.max_memory_bytes or half of available)"),
    (DATA_ROWS_READ, "source rows read (root and branch tables), summed over reads"),
    (
        LATENCY_SERVICE_SECONDS,
        "request scenarios: seconds the steady served calls spent in their steps (retrieve..write; a server "
        "batch once), without queueing, idle waits or harness time between steps",
    ),
    (
        LATENCY_INTRA_OP_THREADS,
        "request scenarios: torch's intra-op thread count in force while the requests were served "
        "(run.request.intra_op_threads; the run's own setting is tag relflow.threads.intra_op); an ONNX "
        "Runtime session keeps its own (compute.predict.intra_op_threads)",
    ),
    (
        LATENCY_P99_SERVER_RULE,
        "server: the lowest latency bound the run passes under LoadGen's server rule (p99, confidence 0.99): "
        "the (t+1)-th slowest request, t the most requests over the bound n requests tolerate "
        "(n >= min_passing(t) + t), and no lower than LoadGen's percentile sample (index int(0.99 n) of the "
        "sorted latencies); above run.request.latency_bound_ms the run is INVALID; absent below 459 requests",
    ),
    (
        LATENCY_ROWS_PER_SERVICE_S,
        "request scenarios: root rows of the steady requests / latency.service_seconds (rows per second of "
        "service time: what the serving path sustains while busy)",
    ),
    (
        LATENCY_ROWS_PER_WALL_S,
        "request scenarios: root rows of the steady requests / latency.duration_seconds (rows per wall second "
        "of the scenario: queueing, idle waits for arrivals and batch fill, harness time included)",
    ),
    (
        "latency.<what>",
        "request scenarios (run.scenario single_stream | server): requests, "
        "roots_per_request, duration_seconds, request_ms.p50|p90|p99|max|mean (nearest-rank), "
        "request_ms.p90_early_stopping|p99_early_stopping (LoadGen's early-stopping estimates, "
        "confidence 0.99; absent when too few requests), issue_lateness_ms.p50|p99|max (server: "
        "how late the generator issued each request against its schedule), first_request_ms (cold, "
        "kept apart), first_request.step_ms.<step>, step_ms.<step>.mean, step_share.<step|queue|other>, "
        "queue_ms.p50|p99, achieved_qps, target_qps, batch_requests.mean|max; cdf_ms is a series whose "
        "steps 0..100 are the percentiles, in ms",
    ),
    (
        REQUESTS_OUTPUTS_MAX_ABS_DIFF,
        "run.request.check_outputs: the largest |served - offline| prediction value (as the write step gets it, "
        "calibrated; the target's present cells) over every served root row, the cold request included, "
        "against an offline pass over the same keys with the same weights, backend and temperature",
    ),
    (
        REQUESTS_OUTPUTS_MISMATCHED_ROOTS,
        "run.request.check_outputs: distinct served roots with a serving beyond requests.outputs_tolerance "
        "(any: INVALID)",
    ),
    (REQUESTS_OUTPUTS_ROOTS_CHECKED, "run.request.check_outputs: distinct served roots compared"),
    (
        REQUESTS_OUTPUTS_TOLERANCE,
        "run.request.check_outputs: the tolerance of the run's serving numerics, on "
        "|served - offline| / max(1, |offline|) (tasks/spec/tolerance.py: "
        "fp32 1e-5, bf16 5e-2, fp16 5e-3, int8 5e-2, onnxruntime 1e-4, triton 1e-4)",
    ),
    (
        REQUESTS_REPEAT_KEY_SPEEDUP,
        "request scenarios: median over root keys in at least two steady requests (cold request left out) of "
        "the latency of the key's first serving / the median latency of its later servings (ratio; about 1 "
        "without a cache, above 1: later servings faster); absent when no key repeats",
    ),
    (
        REQUESTS_REPEAT_KEYS,
        "request scenarios: root keys in at least two steady requests (requests.repeat_key_speedup)",
    ),
    (
        PREDICT_OUTPUTS_MAX_ABS_DIFF,
        "run.check_outputs (offline): the largest |served - plain| prediction value over every root row of the "
        "last predict pass, against a pass over the same keys with no bucketing, padded attention and PyTorch "
        "eager (same weights, precision and temperature), after the timed region",
    ),
    (
        PREDICT_OUTPUTS_MISMATCHED_ROOTS,
        "run.check_outputs (offline): roots beyond predict.outputs_tolerance (any: INVALID)",
    ),
    (PREDICT_OUTPUTS_ROOTS_CHECKED, "run.check_outputs (offline): roots compared"),
    (
        PREDICT_OUTPUTS_TOLERANCE,
        "run.check_outputs (offline): the served numerics' tolerance (tasks/spec/tolerance.py)",
    ),
    (
        SERVER_PEAK_QPS,
        "peak-qps: the highest Poisson rate whose probe was VALID (LoadGen's server rule at --bound-ms "
        "included) below every failing one; logged only when the search bracketed the peak (a rate above "
        "it whose probe missed the bound)",
    ),
    (
        SERVER_PEAK_QPS_BRACKET_LOW,
        "peak-qps: the highest probed rate that passed (a VALID run) below every failing one; without "
        "server.peak_qps_bracket_high (no probe missed the bound) a lower bound on the peak only",
    ),
    (
        SERVER_PEAK_QPS_BRACKET_HIGH,
        "peak-qps: the lowest probed rate whose probe missed the bound (p99 under LoadGen's server rule over "
        "--bound-ms; not a probe INVALID for another reason with its p99 within it, nor a failed run); "
        "without server.peak_qps_bracket_low (no probe passed) the peak is below it, if any",
    ),
    (SERVER_PEAK_PROBES, "peak-qps: probes (fresh-process server runs) the search ran"),
    ("calibration.<what>", "temperature scaling: temperature, fit_seconds"),
    (
        CALIBRATION_FIT_ROWS,
        "held-out labelled cells the temperature was fitted on (the fit half of the held-out "
        "rows, by a stable hash of the root key; train+predict)",
    ),
    (
        CALIBRATION_FIT_ERRORS,
        "fit rows whose top class (binary: side of 0.5) is wrong; 0: the NLL has no finite minimiser "
        "(T -> 0 would multiply every held-out mistake's margin), so the run keeps T = 1",
    ),
    (
        CALIBRATION_REPORT_ROWS,
        "held-out labelled cells quality.nll|ece|brier are scored on: the other half, never "
        "the fit's rows (one predict pass)",
    ),
    (
        DATA_PADDED_COORDS,
        "coordinates the predict batches actually materialised, per predict pass that ran (request "
        "scenarios: per served request, the cold one included; with run.bucketing each batch is padded to "
        "its own longest context, not the schema's reserved shape)",
    ),
    (DATA_BATCH_OCCUPANCY_P50, "median over predict batches of present / materialised coordinates"),
    (DATA_BATCH_OCCUPANCY_MIN, "lowest predict-batch occupancy"),
    (DATA_BATCH_SHAPES, "distinct padded branch-length shapes the model saw in predict"),
    (DATA_TEXT_CELLS, "text cells encoded per pass (text columns only)"),
    (ENCODE_CELLS_PER_S, "text cells / second of the application's encode step"),
    (
        DATA_STRINGS_ENCODED,
        "relational-transformers: strings its encode step turned into vectors per pass (each distinct "
        "category/text value and each column name of a chunk once, summed over chunks), not cells",
    ),
    (ENCODE_STRINGS_PER_S, "relational-transformers: data.strings_encoded's strings / second of its encode step"),
    (
        ENCODE_TEXT_CACHE_HITS,
        "relational-transformers with model.rt.context.builder rt_utils: distinct strings (values and column "
        "names, per encode call) relational-transformers-utils' CachedEncoder already held, over the run",
    ),
    (ENCODE_TEXT_CACHE_MISSES, "the same: strings it had to encode (hashing_encoder), over the run"),
    (
        RT_CONTEXT_STORE_SECONDS,
        "rt_utils builder: seconds reading the graph's tables and building relational-transformers-utils' "
        "ColumnarStore and ContextGraph (once, inside the first encode step)",
    ),
    (
        RT_CONTEXT_ASSEMBLY_SECONDS,
        "rt_utils builder: seconds in the library's ColumnarTraversal.traverse, every context of every encode "
        "call (timed stages, calibration fit and untimed passes alike)",
    ),
    (RT_CONTEXT_CELLS_SECONDS, "rt_utils builder: seconds turning the emitted node ids into cells, the same calls"),
    (RT_CONTEXT_TEXT_SECONDS, "rt_utils builder: seconds in the CachedEncoder (hits and misses), the same calls"),
    (RT_CONTEXT_CONTEXTS, "rt_utils builder: contexts the library assembled over the run"),
    (RT_CONTEXT_BUDGET_FULL, "rt_utils builder: of them, contexts that reached model.rt.context.max_context_cells"),
    (
        RT_CONTEXT_FUTURE_CELLS_DROPPED,
        "rt_utils builder: cells of rows after the context's seed time that the library emitted (it admits a "
        "row's foreign-key parents whatever their time) and the harness left out",
    ),
    (
        RT_CONTEXT_LABEL_CELLS_WITHHELD,
        "rt_utils builder: earlier task rows' labels the library emitted whose window (the task's timedelta) "
        "ends after the context's seed time, left out",
    ),
    (RT_CONTEXT_CELLS_MEAN, "rt_utils builder: present cells per context (target included), predict-pass contexts"),
    (RT_CONTEXT_CELLS_P50, "rt_utils builder: the median of the same"),
    (RT_CONTEXT_CELLS_MAX, "rt_utils builder: the largest of the same"),
    (INPUT_WAIT_FRACTION, "share of compute-stage wall time spent waiting for input (loader worker start-up excluded)"),
    (WORKER_STARTUP_SECONDS, "seconds starting DataLoader workers (run.loader.num_workers > 0)"),
    (
        HOST_PEAK_BYTES,
        "peak resident memory of the benchmark process plus its child processes "
        "(DataLoader workers, Inductor's compiler processes), from the kernel's high-water marks "
        "(the process's VmHWM; each live child's VmHWM minus the pages it shares, so pages a forked "
        "worker shares with its parent count once, in the parent: USS-style, not PSS; ru_maxrss of a "
        "reaped child no sample saw, whole, when above the process's own peak: below it, it may be only the "
        "parent pages a fork/exec child mapped before its exec)",
    ),
    (
        HOST_PEAK_EXCLUDING_COMPILER_BYTES,
        "memory.host_peak_bytes without Inductor's short-lived compiler processes (compile "
        "workers, g++/cc1plus): the repeatable figure to compare compiled runs on",
    ),
    (DEVICE_PEAK_BYTES, "peak CUDA allocator memory (0 on CPU)"),
    (OUTPUT_BYTES, "bytes of the kept prediction file"),
    (OUTPUT_BYTES_PER_ROW, "output.bytes / data.rows_written"),
    (QUALITY_ROWS, "held-out rows scored (one predict pass, not multiplied by repeats)"),
    (
        "quality.<name>",
        "accuracy, majority_rate (category, binary), auc (binary); unseen_class_rows (category: scored rows whose "
        "class the model never learned, each counted as a wrong prediction, never dropped; majority_rate is then "
        "the commonest learned class's share of every scored row); mae, rmse, "
        "mae_of_mean (regression, in the target's own units); nll, ece, brier and "
        "uncalibrated.nll|ece|brier (category, binary: on calibration.report_rows only; brier is "
        "the multi-class definition, mean over rows of the sum over classes of (p - y)^2, range "
        "0..2, for binary too, i.e. twice the one-class (p - y)^2)",
    ),
    (
        "quality.<name>.ci_low",
        "the headline quality.<name>'s 95% interval, lower bound: a percentile bootstrap (2,000 resamples, seed 0, "
        "scipy.stats.bootstrap) over the scored rows, resampling units with replacement: the entities of a RelBench "
        "task (source.relbench: all of an entity's test rows together), else the root rows; logged when there are "
        "two units or more and both bounds are finite. It covers which test rows were drawn in this run, not the "
        "variation between training runs",
    ),
    ("quality.<name>.ci_high", "the upper bound of quality.<name>.ci_low's interval"),
    (
        "relbench.<name>",
        "a RelBench task (source.relbench): each metric the task defines (roc_auc for binary, nmae for "
        "regression: MAE over the training target's sample standard deviation), computed by "
        "relbench.submit.evaluate_task on the run's prediction table (outputs/<name>-<run id>.relbench.csv, "
        "one row per test row)",
    ),
    (
        "relbench.<name>.ci_low",
        "relbench.<name>'s 95% interval, lower bound: the percentile bootstrap of quality.<name>.ci_low (2,000 "
        "resamples, seed 0) over the prediction table's test rows, resampling the task's entities (all of an "
        "entity's seed times together), the metric as relbench defines it (roc_auc: the AUC, ties one half; nmae: "
        "MAE over the training target's sample standard deviation); logged when there are two entities or more and "
        "both bounds are finite",
    ),
    ("relbench.<name>.ci_high", "the upper bound of relbench.<name>.ci_low's interval"),
    (RELBENCH_TEST_ROWS, "a RelBench task: rows of its test split in the prediction table"),
    (
        RELBENCH_TASK_ROWS_SECONDS,
        "a RelBench task: seconds its rows file took to write (relbench's get_table per split, the entity "
        "columns joined), whenever it was written (this run or an earlier one reusing it); before the run, "
        "in no stage",
    ),
    (
        "quality.baseline.train_mean.<name>",
        "a RelBench task: relbench.<name> of predicting the training split's mean label (the positive "
        "rate for binary) for every test row",
    ),
    (
        "quality.baseline.previous.<name>",
        "a RelBench task: relbench.<name> of predicting each test row's entity's label at its previous seed "
        "time (any split before it), the training mean where it has none",
    ),
    (
        "quality.reference.<name>",
        "run.reference_checkpoint: the reference weights' held-out quality.<name> "
        "(PyTorch eager, untimed, after the timed passes)",
    ),
    (
        QUALITY_DELTA_VS_REFERENCE,
        "headline quality minus the reference's, over the same rows (offline: the last pass's held-out "
        "rows; request scenarios: every served request's rows, repeats and the cold request included, "
        "on both sides) (accuracy/auc: higher is better; mae: lower is better)",
    ),
    (
        QUALITY_DROP_VS_REFERENCE,
        "how much worse than the reference (positive = worse), checked against run.max_quality_drop",
    ),
    (CHECKPOINT_BYTES, "bytes of the run.checkpoint file loaded (any weight format)"),
    (CHECKPOINT_LOAD_SECONDS, "seconds to read and expand run.checkpoint to full precision (before the timed region)"),
    (HOST_AFTER_LOAD_BYTES, "resident memory of the process right after loading run.checkpoint"),
    (
        MODEL_BYTES_AFTER_LOAD,
        "resident bytes of the served model's weights (state_dict tensors) once the backend is set up, each "
        "storage once at its stored dtype (native fp8 codes 1 byte; portable PyTorch expands "
        "fp16/int8/int4 to fp32 at load, so those equal fp32)",
    ),
    (MODEL_BYTES_FP32, "bytes the same tensors take in fp32"),
    (EXPORT_SECONDS, "run.backend onnxruntime without a bundle: seconds exporting the served checkpoint (not in e2e)"),
    (EXPORT_BYTES, "bytes of the exported model.onnx"),
    (
        EXPORT_QUANTIZE_SECONDS,
        "run.onnxruntime.quantization dynamic_int8: seconds of ONNX Runtime's quantize_dynamic (once per bundle)",
    ),
    (BACKEND_LOAD_SECONDS, "seconds creating the serving backend (ONNX Runtime session; 0 for PyTorch)"),
    (BACKEND_MODEL_BYTES, "bytes of the model file the backend serves (ONNX file, or the checkpoint)"),
    (
        BACKEND_FP8_FALLBACK_CALLS,
        "native fp8 (Fp8Linear) only: Linear calls that dequantized the whole weight because a dim "
        "(the row count, under packing) was not a multiple of 16; relflow.weights_native=true only at 0",
    ),
    (HARNESS_DATA_SECONDS, "seconds to check inputs and generate data before the run"),
    (HARNESS_STARTUP_SECONDS, "Prefect + MLflow start-up (never inside e2e)"),
    (HARNESS_MLFLOW_STARTUP_SECONDS, "MLflow run start"),
    (HARNESS_REGION_SECONDS, "wall seconds of the timed region; the harness.* buckets below add up to it exactly"),
    (
        HARNESS_REGION_GC_SECONDS,
        "seconds Python's cyclic garbage collector ran inside the timed region (objects alive before it are "
        "frozen out: gc.freeze); not a bucket, the pauses fall inside whichever bucket was running",
    ),
    (HARNESS_REGION_GC_COLLECTIONS, "collections (any generation) that ran inside the timed region"),
    (HARNESS_STAGE_SECONDS, "timed-region seconds in the stage table (both phases: e2e.train + e2e.predict)"),
    (
        HARNESS_ENGINE_SETUP_SECONDS,
        "timed-region seconds building the model engine (model, weights, compile wrappers) once "
        "the schema is known, with a request scenario's untimed encoding fit when it has no checkpoint",
    ),
    (
        HARNESS_CALIBRATION_FIT_SECONDS,
        "timed-region seconds fitting the output temperature (validation forward passes)",
    ),
    (HARNESS_BACKEND_SETUP_SECONDS, "timed-region seconds starting the serving backend (export, session, checkpoint)"),
    (HARNESS_REQUEST_WAIT_SECONDS, "server scenario: timed-region seconds idle, waiting for arrivals and batch fill"),
    (
        HARNESS_REQUEST_SETTLE_SECONDS,
        "request scenarios: timed-region seconds of the served calls' bookkeeping (figures, stage table, "
        "quality), outside every request's latency; the server settles at most a few calls' worth per idle gap",
    ),
    (
        HARNESS_DISTRIBUTED_LAUNCH_SECONDS,
        "DDP: torchrun start-up, the reference run and rank wall time outside the ranks' stage seconds",
    ),
    (
        HARNESS_ORCHESTRATION_SECONDS,
        "timed-region seconds in no other bucket: Prefect task calls and bookkeeping only "
        "(harness.region_seconds minus every other harness.* bucket)",
    ),
    (HARNESS_LOCK_WAIT_SECONDS, "seconds waiting for the host lock"),
    (HARNESS_REGION_START, "unix time the timed region started"),
    (HARNESS_REGION_END, "unix time the timed region ended"),
    (HARNESS_FLOW_SECONDS, "flow seconds up to final logging"),
    (HARNESS_FLOW_OVERHEAD_SECONDS, "flow seconds outside e2e.train + e2e.predict"),
    (
        HARNESS_TRACE_LOGGING_SECONDS,
        "request scenarios: seconds building and storing the request traces, after the timed "
        "region (in no harness.region_seconds bucket and not in harness.flow_seconds)",
    ),
    (
        HARNESS_TRACE_LOGGING_SECONDS_PER_TRACE,
        "harness.trace_logging_seconds / traces built: the mean per trace with the logging call's fixed cost "
        "(MLflow's trace exporter flush and processor retirement, 3-5 s here) spread over them, so it falls as "
        "more are logged (1 trace 3.2-4.8 s, 10 traces 0.47-0.51 s each; one more trace ~0.1 s), not the "
        "marginal cost of one trace",
    ),
    (
        REQUESTS_TRACES_LOGGED,
        "request scenarios: requests stored as MLflow traces linked to the run (the 10 slowest "
        "plus a run.request.trace_sample_rate share drawn with run.seed), counted back from the store",
    ),
    (HOST_LOAD_PER_CORE_START, "1-minute load average per core before the region (context only)"),
    (
        HOST_OTHER_CPU_FRACTION_BEFORE,
        "share of all cores busy with other processes over a 0.5 s window just before the timed region",
    ),
    (
        HOST_OTHER_CPU_FRACTION,
        "share of all cores' time used by other processes during the timed "
        "region (from the OS CPU counters minus this process tree; the tree's time includes "
        "descendants reaped by a still-live child, e.g. g++ under Inductor's compile workers)",
    ),
    (
        HOST_STEAL_FRACTION,
        "share of all cores' time the hypervisor stole during the timed region (/proc/stat steal; "
        "also inside host.other_cpu_fraction); tags relflow.cpu_flags|cpu_governor|cpu_boost say the host settings",
    ),
    (
        "stage.<stage>.<phase>.bytes",
        "bytes the stage handled in that phase: retrieve the bytes read (as data.bytes_read, key "
        "listing included), preprocess the Arrow bytes handed to it, tensorize the bytes of the "
        "tensors it produced, write the prediction file's bytes x passes",
    ),
    (
        "stage.<stage>.predict.warm_seconds",
        "offline runs with run.repeats >= 2: the stage's seconds in the predict passes after the first "
        "(pass 0 holds the first calls, compilation and cold caches), what floor.<stage>.fraction sets "
        "against its warm floor",
    ),
    (
        "stage.<stage>.predict.warm_bytes",
        "offline runs with run.repeats >= 2: the bytes the stage counted in the predict passes after the "
        "first (retrieve, preprocess, tensorize; the root-key listing's read is before pass 0)",
    ),
    (
        "floor.<stage>.fraction",
        "the predict stage's own warm rate over its floor's, a warm best of 5 (1.0 = at the floor; "
        "tasks/run/floors.py): retrieve and tensorize bytes/s from stage.<stage>.predict.warm_bytes|"
        "warm_seconds, write output.bytes x (passes - 1) over its warm_seconds (offline runs with "
        "run.repeats >= 2 only: one pass has no warm figure, so no fraction); compute is "
        "compute.model_flops_per_s (present-coordinate FLOP/s of the steady batches, any scenario) over a "
        "floor whose GEMMs are at present lengths too; "
        "orchestration as seconds of one no-op Prefect task call over the run's orchestration seconds per "
        "task call",
    ),
    ("floor.retrieve.bytes_per_s", "floor: the plainest reader of the source, same columns and row groups"),
    (
        "floor.preprocess.rows_per_s",
        "floor (time-anchored roots: schema.root.seed_time): (entity, seed time) rows per second of DuckDB "
        "doing the as-of work of one chunk: each branch joined to its parent rows on the key with time <= "
        "seed time, the newest max_length kept per parent (row_number), nested levels too; the inputs "
        "in memory as Arrow, no nesting into lists",
    ),
    ("floor.tensorize.bytes_per_s", "floor: a memcpy (torch.empty_like(t).copy_) of one chunk's tensors"),
    (
        "floor.compute.flops_per_s",
        "floor: matmul FLOP/s at the model's own GEMM shapes: linears over a batch's present coordinates, "
        "attention at each branch's mean present length (the sample's roots' longest present instance, as "
        "compute.model_flops_per_s counts them), at compute.predict.intra_op_threads",
    ),
    ("floor.write.bytes_per_s", "floor: pyarrow.parquet.write_table of one chunk's prediction table, same folder"),
    ("floor.orchestration.calls_per_s", "floor: no-op Prefect task calls per second"),
    (FLOOR_PREPROCESS_INPUT_BYTES_PER_S, "preprocess has no single floor: its rate in input (Arrow) bytes/s"),
    (FLOOR_PREPROCESS_SHARE, "preprocess's share of end-to-end predict seconds"),
    (FLOOR_CACHED, "1 when the floor ledger came from the cache, 0 when measured in this run (after the timed region)"),
    (FLOOR_OTHER_CPU_FRACTION, "share of the cores other processes used while the floors were measured"),
    (
        "system/<name>",
        "MLflow system metrics (run.system_metrics_interval_s), sampled in memory and logged after the timed region",
    ),
)

_PLACEHOLDER = re.compile(r"<[a-z]+>")


def _pattern(entry: str) -> re.Pattern[str]:
    parts = _PLACEHOLDER.split(entry)
    holes = _PLACEHOLDER.findall(entry)
    rx = ""
    for i, part in enumerate(parts):
        rx += re.escape(part)
        if i < len(holes):
            if holes[i] in ("<what>", "<key>", "<name>"):
                rx += r"[A-Za-z0-9_.|:-]+"
            elif holes[i] in ("<table>", "<column>"):  # data names: any word characters, spaces
                rx += r"[\w -]+"
            else:
                rx += r"[A-Za-z0-9_-]+"
    return re.compile(rf"^{rx}$")


_PATTERNS = [_pattern(k) for k, _ in CATALOGUE]


def documented(key: str) -> bool:
    """Whether ``key`` is a catalogued key or belongs to a catalogued family."""
    return any(p.match(key) for p in _PATTERNS)


def readme_lines() -> list[str]:
    """The README's metric list, one bullet per catalogue entry."""
    return [f"- `{k}`: {text}" for k, text in CATALOGUE]


README_BEGIN = "<!-- metric-keys:begin (generated from tasks/measure/keys.py) -->"
README_END = "<!-- metric-keys:end -->"
