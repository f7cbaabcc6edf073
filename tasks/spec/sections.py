"""Harness sections of a spec file: ``sweep:`` and ``schedule:``.

A spec YAML may carry two optional top-level sections that say how to *run* the workload,
not what it is, so they are split off before the spec is validated and never enter the
spec hash (changing a schedule or a grid does not make a different workload)::

    sweep:
      grid:                        # dotted key (as for --set) -> values; Cartesian product
        run.batch_size: [64, 256, 1024]
        run.packing: [auto, "off"]
    schedule:
      cron: "0 3 * * *"            # Prefect deployment schedule (relflow-bench serve)
      timezone: UTC

Each section is validated like the spec (``extra="forbid"``, messages naming the key).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tasks.runtime.errors import UserError
from tasks.spec import Spec, parse_spec, read_spec_file
from tasks.spec.parse import complete_and_override

HARNESS_SECTIONS = ("sweep", "schedule")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SweepSection(_Strict):
    grid: dict[str, list[Any]] = Field(
        description="dotted spec key (as for --set; branches by name) -> values to sweep"
    )
    pool: str | None = Field(None, description="Prefect work pool: fan configurations out to its workers")
    queue: str | None = Field(None, description="work queue of the pool (a queue per host pins the sweep)")


class ScheduleSection(_Strict):
    cron: str = Field(description="cron expression for the Prefect deployment, e.g. '0 3 * * *'")
    timezone: str = Field("UTC", description="IANA time zone the cron expression is read in")


class Sections(_Strict):
    sweep: SweepSection | None = None
    schedule: ScheduleSection | None = None


def split_sections(raw: dict[str, Any], source: str = "") -> tuple[dict[str, Any], Sections]:
    """Remove ``sweep``/``schedule`` from a raw spec mapping; returns (spec mapping, sections)."""
    rest = {k: v for k, v in raw.items() if k not in HARNESS_SECTIONS}
    picked = {k: raw[k] for k in HARNESS_SECTIONS if k in raw}
    try:
        return rest, Sections.model_validate(picked)
    except ValidationError as err:
        parts = []
        for e in err.errors():
            loc = ".".join(str(p) for p in e["loc"])
            if e["type"] == "extra_forbidden":
                parts.append(f"unknown key '{loc}'; remove it or fix its spelling")
            elif e["type"] == "missing":
                parts.append(f"'{loc}' is required; add it")
            else:
                parts.append(f"'{loc}': {e['msg']}")
        raise UserError(f"Invalid harness section in spec {source}: " + "; ".join(parts) + ".") from None


def load_spec_and_sections(path: str | Path, overrides: list[str] | None = None) -> tuple[Spec, Sections]:
    """Like ``tasks.spec.load_spec``, but a ``sweep:``/``schedule:`` section is allowed and returned."""
    raw = read_spec_file(path)
    raw, sections = split_sections(raw, f"'{path}'")
    raw = complete_and_override(raw, overrides or [], Path(path).resolve().parent)
    return parse_spec(raw, f"'{path}'"), sections
