"""Prefect artifacts for a benchmark run: its stage table, pointing at the MLflow run.

Called at the end of the ``benchmark`` flow with the flow's summary dict. The table
(phase, stage, seconds, root rows, rows/s, share of the phase, plus one end-to-end row per
phase: training and predicting are never summed) shows on the
flow run's Artifacts tab; the description names the MLflow run id, experiment and store.
The key ``relflow-<experiment>-stages`` keeps one versioned artifact per workload, so the
Artifacts page shows the latest run's table with its history. When MLflow is a server
(http/https URI) a link artifact to the run is published too.

Publishing never fails the benchmark: the measurements are already in MLflow, so an
artifact error is logged as a warning and the run stays FINISHED.
"""

from __future__ import annotations

import logging
import re
from typing import Any
from uuid import UUID

from tasks.tracking.uri import is_server

log = logging.getLogger(__name__)


def artifact_key(experiment: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    slug = re.sub(r"[^a-z0-9-]+", "-", experiment.lower()).strip("-") or "run"
    return f"relflow-{slug}-stages"


def stage_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The stage table as rows (rounded for display), end-to-end last."""
    from tasks.measure import keys as K

    m = summary["metrics"]
    rows = []
    for phase in K.PHASES:
        part = [r for r in summary["stages"] if r.get("phase") == phase]
        if not part:
            continue
        rows += [
            {
                "phase": phase,
                "stage": r["stage"],
                "seconds": round(r["seconds"], 4),
                "root rows": r["rows"],
                "rows/s": round(r["rows_per_s"], 1),
                "share of phase": f"{r['share']:.1%}",
            }
            for r in part
        ]
        rows.append(
            {
                "phase": phase,
                "stage": "end-to-end",
                "seconds": round(m[K.e2e(phase, "seconds")], 4),
                "root rows": int(m[K.e2e(phase, "rows")]),
                "rows/s": round(m[K.e2e(phase, "rows_per_s")], 1),
                "share of phase": "100%",
            }
        )
    return rows


def run_url(summary: dict[str, Any]) -> str | None:
    """The MLflow UI address of the run when the store is a server, else None."""
    uri = str(summary.get("tracking_uri") or "")
    if not is_server(uri):  # HTTPS://, too
        return None
    return f"{uri.rstrip('/')}/#/experiments/{summary['experiment_id']}/runs/{summary['run_id']}"


def publish_run_artifact(summary: dict[str, Any]) -> UUID | None:
    """Publish the stage table (and a link when MLflow is a server); returns the table's id."""
    from prefect.artifacts import create_link_artifact, create_table_artifact

    try:
        url = run_url(summary)
        where = f"[{summary['run_id']}]({url})" if url else f"`{summary['run_id']}`"
        description = (
            f"MLflow run {where} in experiment '{summary['experiment']}' "
            f"({summary['tracking_uri']}); validity {summary['validity']}"
            + (f": {'; '.join(summary['invalid_reasons'])}" if summary.get("invalid_reasons") else "")
        )
        key = artifact_key(summary["experiment"])
        table_id = create_table_artifact(table=stage_rows(summary), key=key, description=description)
        if url:
            create_link_artifact(
                link=url, link_text=f"MLflow run {summary['run_id']}", key=key.removesuffix("-stages") + "-mlflow-run"
            )
        return table_id
    except Exception as err:  # noqa: BLE001 - never fail a finished, recorded run
        log.warning("could not publish the Prefect stage artifact: %s: %s", type(err).__name__, err)
        return None
