"""The models under test (``model.library``), found through one registry: ``LIBRARIES``.

One line per library: its ``model.library`` name -> ``"module:attribute"``, the ``Library``
(tasks/libraries/base.py) that module defines. A library is imported only when a run names
it (``library_named``): relflow brings Lightning, whose import costs seconds that another
library's run should not pay, and the checks before work import no library's own package.

Everything else asks the ``Library`` (its version's distribution, the packages the environment
fingerprint tags, whether it loads ``run.checkpoint`` itself, its checkpoint's weight formats,
its floors) instead of testing its name. Adding a library is a folder beside this file and one
line here.
"""

from __future__ import annotations

import importlib

from tasks.libraries.base import Library, ModelSide, Unsupported, version_of
from tasks.runtime.errors import UserError
from tasks.spec import Spec

__all__ = [
    "DEFAULT_LIBRARY",
    "LIBRARIES",
    "Library",
    "ModelSide",
    "Unsupported",
    "check_library",
    "libraries",
    "library_for",
    "library_named",
    "library_packages",
    "library_tags",
    "version_of",
]

LIBRARIES: dict[str, str] = {
    "reference": "tasks.libraries.reference:REFERENCE",
    "relflow": "tasks.libraries.relflow:RELFLOW",
    "relational_transformers": "tasks.libraries.relational_transformers:RELATIONAL_TRANSFORMERS",
    "lightgbm": "tasks.libraries.lightgbm:LIGHTGBM",
}
DEFAULT_LIBRARY = "reference"  # model.library's default (tasks/spec/task.py): the model in model/


def library_named(name: str) -> Library:
    """The registered library called ``name`` (its module imported on first use); a name not
    in ``LIBRARIES`` is a ``UserError`` (exit 2) listing the registered ones."""
    target = LIBRARIES.get(name)
    if target is None:
        raise UserError(
            f"model.library {name!r} is not a registered library; choose from {', '.join(LIBRARIES)} "
            "(tasks/libraries/__init__.py LIBRARIES), e.g. --set model.library=reference."
        )
    module, _, attribute = target.partition(":")
    library: Library = getattr(importlib.import_module(module), attribute)
    return library


def libraries() -> list[Library]:
    """Every registered library, in the registry's order (their light modules only)."""
    return [library_named(name) for name in LIBRARIES]


def library_packages() -> list[str]:
    """Every registered library's ``packages``, once each: the versions a run's environment
    fingerprint tags (tasks/measure/environment.py), whichever library ran."""
    return list(dict.fromkeys(p for library in libraries() for p in library.packages))


def library_for(spec: Spec) -> Library:
    """The library ``spec`` names (``model.library``). A run asks once, in its plan
    (tasks/run/checks/plan.py ``Plan.library``), and hands the ``Library`` down."""
    return library_named(spec.model.library)


def check_library(spec: Spec) -> Library:
    """The library, after refusing (``UserError``, exit 2) what it cannot honour in ``spec``."""
    library = library_for(spec)
    library.check(spec)
    return library


def library_tags(library: Library) -> dict[str, str]:
    """The run's tags for the model under test."""
    return {"relflow.library": library.name, "relflow.library_version": version_of(library)}
