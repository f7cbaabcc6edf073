"""Golden records of a run's names (issue 42 item 5): the metric keys, parameter keys and tag
keys of one reference, one relflow and one relational-transformers run, so a structural change
that must change nothing (the layers, typed reports, the registry) shows every name it adds or
loses. Values are left out (timings move with the host); the names are the contract users'
scripts and dashboards read.

A test calls ``check_golden(name, run)`` on the MLflow run it already made. After a change that
adds or renames keys on purpose, rewrite the files with ``RELFLOW_UPDATE_GOLDEN=1 pytest <those
tests>`` and review the diff of ``tests/golden/*.json`` like code.
"""

from __future__ import annotations

import json
import os
from typing import Any

from tests.repo import REPO

GOLDEN = REPO / "tests" / "golden"
# Names that come and go with the host or the checkout, not with the harness's code: MLflow's own
# source tags, the git tags of a run from a dirty or clean tree, and relflow.floor.untrusted, set
# only when the floors were measured on a busy host (tasks/measure/floor_trust.py).
VOLATILE_TAGS = ("mlflow.source.git.", "mlflow.gitRepoURL", "mlflow.log-model.history", "relflow.floor.untrusted")


def names_of(run: Any) -> dict[str, list[str]]:
    return {
        "metrics": sorted(run.data.metrics),
        "params": sorted(run.data.params),
        "tags": sorted(t for t in run.data.tags if not t.startswith(VOLATILE_TAGS)),
    }


def check_golden(name: str, run: Any) -> None:
    path = GOLDEN / f"{name}.json"
    got = names_of(run)
    if os.environ.get("RELFLOW_UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(got, indent=1) + "\n")
        return
    want = json.loads(path.read_text())
    diff = {
        part: {"lost": sorted(set(want[part]) - set(got[part])), "new": sorted(set(got[part]) - set(want[part]))}
        for part in want
    }
    changed = {p: d for p, d in diff.items() if d["lost"] or d["new"]}
    assert not changed, (
        f"{name}: the run's names differ from tests/golden/{name}.json (rewrite with "
        f"RELFLOW_UPDATE_GOLDEN=1 if on purpose): {json.dumps(changed, indent=1)}"
    )
