"""Scheduled benchmarks: Prefect deployments of the ``benchmark`` flow, one per spec.

``relflow-bench serve`` validates each spec (``benchmarks/*.yaml`` by default), then creates
or updates a deployment ``benchmark/<spec name>@<pool>`` on a **process work pool** (one pool
per hardware class; a worker on a host of that class runs the flow in a subprocess). The
deployment's parameters are the validated spec itself plus its folder, so a scheduled run
measures exactly what was deployed (redeploy to pick up edits); Prefect enforces the flow's
parameter schema on every run. The schedule is ``schedule.cron`` from the spec file, or
``--cron`` for all specs; without either the deployment runs on demand only.

The flow entrypoint is the module path ``flows.benchmark:benchmark`` (the package is
installed, so no code upload is needed). The flow-run process gets the tracking URI that was
in force when deploying (``MLFLOW_TRACKING_URI``, else the absolute local SQLite default)
and the chosen working directory, so runs land in the same MLflow store as the deployer's.
One benchmark per host at a time is kept by the host lock inside the flow.

Deployments need a real server (``prefect server start --host 127.0.0.1``): Prefect's
temporary server exits with the process and never fires schedules, so ``serve`` refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.runtime.errors import UserError
from tasks.runtime.masking import mask_uri
from tasks.spec.sections import load_spec_and_sections


@dataclass
class Planned:
    path: Path
    name: str  # deployment name (spec name @ pool)
    spec: dict[str, Any]
    cron: str | None
    timezone: str
    spec_hash: str


def default_pool() -> str:
    """One work pool per hardware class: ``relflow-cpu`` or ``relflow-cuda``."""
    import torch

    return "relflow-cuda" if torch.cuda.is_available() else "relflow-cpu"


def check_cron(cron: str, source: str) -> None:
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=cron)
    except ValueError:
        raise UserError(
            f"{source}: '{cron}' is not a valid cron expression (five fields, e.g. '0 3 * * *' for 03:00 every day)."
        ) from None


def plan_deployments(
    paths: list[Path], pool: str, overrides: list[str], cron: str | None, timezone: str | None
) -> list[Planned]:
    """Validate every spec (and its schedule) before anything is created."""
    if not paths:
        raise UserError("No spec files to deploy; pass SPEC paths or add YAML files to benchmarks/.")
    planned: list[Planned] = []
    for path in paths:
        spec, sections = load_spec_and_sections(path, overrides)
        sched = sections.schedule
        use_cron = cron or (sched.cron if sched else None)
        if use_cron:
            check_cron(use_cron, "--cron" if cron else f"'{path}' schedule.cron")
        planned.append(
            Planned(
                path.resolve(),
                f"{spec.name}@{pool}",
                spec.to_dict(),
                use_cron,
                timezone or (sched.timezone if sched else "UTC"),
                spec.spec_hash,
            )
        )
    names = [p.name for p in planned]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UserError(
            f"Two spec files share a name, so their deployments would collide: {dupes}; give each spec a unique 'name'."
        )
    return planned


def require_server() -> str:
    """The API URL of a running Prefect server; ``UserError`` if there is none to talk to."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise UserError(
            "relflow-bench serve needs a running Prefect server (Prefect's temporary server exits "
            "with this process and never fires schedules). Start one with `prefect server start "
            "--host 127.0.0.1`, then `prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api` "
            "(or export PREFECT_API_URL)."
        )
    with get_client(sync_client=True) as client:
        err = client.api_healthcheck()
    if err is not None:
        raise UserError(
            f"The Prefect server at PREFECT_API_URL={mask_uri(url)} does not answer ({err}); start "
            "it with `prefect server start --host 127.0.0.1` or fix PREFECT_API_URL."
        )
    return url


def ensure_pool(pool: str, create: bool) -> bool:
    """Check the work pool exists (create a process pool if asked); True when created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            found = client.read_work_pool(pool)
        except ObjectNotFound:
            if not create:
                raise UserError(
                    f"Work pool '{pool}' does not exist; create it with `prefect work-pool "
                    f"create {pool} --type process` or pass --create-pool."
                ) from None
            client.create_work_pool(
                WorkPoolCreate(
                    name=pool, type="process", base_job_template=ProcessWorker.get_default_base_job_template()
                )
            )
            return True
    if found.type != "process":
        raise UserError(
            f"Work pool '{pool}' is of type '{found.type}'; relflow-bench deploys to "
            "process pools (the worker runs the benchmark on its own host)."
        )
    return False


def deploy(planned: list[Planned], pool: str, working_dir: Path) -> list[str]:
    """Create or update one deployment per planned spec; returns their ids."""
    from prefect import deploy as prefect_deploy
    from prefect.schedules import Cron
    from prefect.types.entrypoint import EntrypointType

    from flows.benchmark import benchmark
    from tasks.tracking.uri import tracking_uri  # MLflow: after the specs were validated

    uri = tracking_uri()
    deployments = []
    for p in planned:
        deployments.append(
            benchmark.to_deployment(
                name=p.name,
                schedules=[Cron(p.cron, timezone=p.timezone)] if p.cron else None,
                parameters={
                    "spec": p.spec,
                    "spec_dir": str(p.path.parent),
                    "tags": {
                        "relflow.deployment": f"benchmark/{p.name}",
                        "relflow.pool": pool,
                        "relflow.spec_file": str(p.path),
                    },
                },
                description=f"relflow benchmark '{p.spec['name']}' from {p.path} (spec hash {p.spec_hash})",
                tags=["relflow", pool],
                version=p.spec_hash,
                enforce_parameter_schema=True,
                entrypoint_type=EntrypointType.MODULE_PATH,
                job_variables={"working_dir": str(working_dir), "env": {"MLFLOW_TRACKING_URI": uri}},
            )
        )
    ids = prefect_deploy(
        *deployments, work_pool_name=pool, build=False, push=False, print_next_steps_message=False, ignore_warnings=True
    )
    return [str(i) for i in ids]
