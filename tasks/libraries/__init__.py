"""The models under test (``model.library``), one module or folder per library.

- ``reference``: the model in ``model/`` (the default)
- ``relflow``: relflow 0.4.0, the library of the first product note (``relflow/``)
- ``relational_transformers``: RelativeDB's relational-transformers 0.1.0, the second
  note's (``relational_transformers/``)

Each is imported only when a spec asks for it: relflow brings Lightning, whose import costs
seconds that a reference run should not pay.
"""

from __future__ import annotations

from tasks.libraries.base import Library, ModelSide, Unsupported, version_of
from tasks.spec import Spec

__all__ = ["Library", "ModelSide", "Unsupported", "check_library", "library_for", "library_tags", "version_of"]


def library_for(spec: Spec) -> Library:
    """The library ``spec`` names (``model.library``)."""
    name = spec.model.library
    if name == "relflow":
        from tasks.libraries.relflow import RELFLOW

        return RELFLOW
    if name == "relational_transformers":
        from tasks.libraries.relational_transformers import RELATIONAL_TRANSFORMERS

        return RELATIONAL_TRANSFORMERS
    from tasks.libraries.reference import Reference

    return Reference()


def check_library(spec: Spec) -> Library:
    """The library, after refusing (``UserError``, exit 2) what it cannot honour in ``spec``."""
    library = library_for(spec)
    library.check(spec)
    return library


def library_tags(library: Library) -> dict[str, str]:
    """The run's tags for the model under test."""
    return {"relflow.library": library.name, "relflow.library_version": version_of(library)}
