"""The plan: every check of a run that can fail on user input, before any work.

``plan`` validates the spec's settings, sources and data (``UserError``, exit 2, naming the key
and the fix), makes the data available (generating TPC-H once), loads and checks a checkpoint,
and returns what the run needs. The CLI calls it before Prefect starts; the flow calls it again
(the cheap checks repeat) so a flow started by a deployment is checked the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import torch

from tasks.backends.checkpoint import LoadedCheckpoint, load_run_checkpoint
from tasks.libraries import Library, check_library
from tasks.measure.clock import wall_clock
from tasks.run.backend_setup import BackendPlan, check_backend, check_backend_settings
from tasks.run.checks import distributed
from tasks.run.checks.data import check_data_before_work, check_files, check_table_folders
from tasks.run.checks.preflight import check_before_work
from tasks.run.reference_pass import check_reference
from tasks.sources.files import SourceTable, check_sources, resolve_sources
from tasks.sources.open import data_home, open_database, open_relbench
from tasks.sources.tables import Sources
from tasks.spec import Spec
from tasks.stages import compute as compute_stage
from tasks.stages.encode import check_text


@dataclass(kw_only=True)
class Plan:
    """Everything checked before the run starts."""

    spec: Spec
    library: Library  # model.library, asked once per run and handed down (flow tags, chain, floors)
    sources: Sources
    device: torch.device
    checkpoint: LoadedCheckpoint | None
    data_seconds: float
    generated: bool
    spec_dir: Path = Path(".")  # where relative source paths resolve (DDP ranks re-plan from it)
    data_metrics: dict[str, float] = field(default_factory=dict)  # tasks/run/checks/data.py counts
    warnings: list[str] = field(default_factory=list)
    backend: BackendPlan = field(default_factory=BackendPlan)  # run.backend (tasks/backends)
    reference: LoadedCheckpoint | None = None  # run.reference_checkpoint, loaded and checked
    task_rows_seconds: float = 0.0  # a RelBench task's rows written before the run (tasks/sources/relbench.py)


def plan(spec: Spec, spec_dir: Path) -> Plan:
    """Validate inputs and make the data available; raises ``UserError`` before any work.

    The returned ``Plan.spec`` reserves at most the data's observed rows per parent in each
    branch (tasks/run/checks/data.py); the run's params and spec hash stay the configured spec's."""
    t0 = wall_clock()
    library = check_library(spec)  # what it cannot honour, before anything else (exit 2)
    notes = check_before_work(spec)  # tracking store, output folder, device name, stale runs
    check_backend_settings(spec)  # e.g. an execution provider this onnxruntime build lacks
    check_text(spec)  # a plug-in text encoder loads: settings first, the data scans after
    # The same opening as every rank and script (tasks/sources/open.py), with the file checks.
    home = data_home(spec, spec_dir)
    sources: Sources
    rows_seconds = 0.0  # writing the task rows (a RelBench folder)
    if spec.source.relbench is not None:  # a RelBench folder: its tables and its task's rows
        sources, rows_seconds = open_relbench(spec, spec_dir, home)
        check_files(spec, sources)
    elif spec.source.database is not None:  # tables in a database (tasks/sources/databases.py)
        sources = dict(open_database(spec, spec_dir, home))
    else:
        check_table_folders(spec, home.base)  # "holds no data files", not "does not exist"
        sources = dict(resolve_sources(spec, home.base))
        check_files(spec, sources)  # corrupt files and folders of mixed types, named
    # database tables answer the same metadata questions as files (tasks/sources/tables.py)
    check_sources(spec, cast(dict[str, SourceTable], sources))
    # keys, duplicates, non-finite values, target, memory; the run uses the reserved lengths
    spec, data_metrics, data_notes = check_data_before_work(spec, sources)
    device = compute_stage.resolve_device(spec)
    compute_stage.check_precision(spec, device)
    distributed.check(spec, device)
    ckpt = None
    if spec.run.checkpoint and not library.own_checkpoint:  # a library may load its own format
        # predict: its weights; train+predict: resume (settings checked)
        ckpt = load_run_checkpoint(Path(spec.run.checkpoint), spec)
    backend, ckpt = check_backend(spec, ckpt)  # providers, bundle (it may stand in for ckpt)
    reference = check_reference(spec, ckpt.encoding if ckpt else None)
    return Plan(
        spec=spec,
        library=library,
        sources=sources,
        device=device,
        checkpoint=ckpt,
        data_seconds=wall_clock() - t0,
        generated=home.generated,
        spec_dir=spec_dir,
        data_metrics=data_metrics,
        warnings=notes + data_notes,
        backend=backend,
        reference=reference,
        task_rows_seconds=rows_seconds,
    )
