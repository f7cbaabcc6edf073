"""Reading a spec: the YAML file, ``--set`` overrides, and validation errors as one paragraph naming each key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tasks.runtime.errors import UserError
from tasks.spec.workload import Spec


def _set_path(raw: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``a.b.c`` in nested dicts; list items are addressed by branch name."""
    node: Any = raw
    parts = dotted.split(".")
    for part in parts[:-1]:
        if isinstance(node, list):
            match = [b for b in node if isinstance(b, dict) and b.get("name") == part]
            if not match:
                raise UserError(f"--set {dotted}: no branch named '{part}' at this level.")
            node = match[0]
            continue
        if not isinstance(node, dict):
            raise UserError(f"--set {dotted}: '{part}' is not a section, so it has no keys.")
        node = node.setdefault(part, {})
    if not isinstance(node, dict):
        raise UserError(f"--set {dotted}: the parent of '{parts[-1]}' is not a section.")
    node[parts[-1]] = value


def branch_path(raw: dict[str, Any], dotted: str) -> str:
    """Let users write ``lineitem.max_length`` for a branch anywhere in the tree."""
    first = dotted.split(".", 1)[0]
    if first in {"name", "source", "schema", "task", "model", "run"}:
        return dotted

    def find(branches: list[Any], trail: str) -> str | None:
        for b in branches or []:
            if isinstance(b, dict) and b.get("name") == first:
                return f"{trail}.{first}"
            hit = find(b.get("branches", []) if isinstance(b, dict) else [], f"{trail}.{b.get('name')}.branches")
            if hit:
                return hit
        return None

    hit = find(raw.get("schema", {}).get("branches", []), "schema.branches")
    if hit is None:
        raise UserError(
            f"--set {dotted}: '{first}' is neither a top-level section (name, source, schema, "
            "task, model, run) nor a branch name."
        )
    return hit + dotted[len(first) :]


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        if "=" not in item:
            raise UserError(f"--set '{item}' must look like key.path=value, e.g. run.batch_size=512")
        key, text = item.split("=", 1)
        _set_path(raw, branch_path(raw, key.strip()), yaml.safe_load(text))
    return raw


def _key_path(loc: tuple[Any, ...], raw: Any) -> str:
    """Pydantic's location as the user writes it: list items by branch name, not index."""
    parts, node = [], raw
    for p in loc:
        if isinstance(node, list) and isinstance(p, int) and p < len(node):
            node = node[p]
            name = node.get("name") if isinstance(node, dict) else None
            parts.append(str(name) if isinstance(name, str) and name else str(p))
            continue
        parts.append(str(p))
        node = node.get(p) if isinstance(node, dict) else None
    return ".".join(parts)


def _describe(err: ValidationError, source: str, raw: Any = None) -> str:
    lines = []
    for e in err.errors():
        loc = _key_path(e["loc"], raw) or "(top level)"
        if e["type"] == "extra_forbidden":
            msg = f"unknown key '{loc}'; remove it or fix its spelling"
        elif e["type"] == "missing":
            msg = f"'{loc}' is required; add it"
        else:
            got = e.get("input")
            shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
            msg = f"'{loc}': {e['msg']}{shown}"
        lines.append(msg)
    return f"Invalid benchmark spec {source}: " + "; ".join(lines) + "."


def parse_spec(raw: dict[str, Any], source: str = "") -> Spec:
    try:
        return Spec.model_validate(raw)
    except ValidationError as err:
        raise UserError(_describe(err, source, raw)) from None


def read_spec_file(path: str | Path) -> dict[str, Any]:
    """The spec file's top-level mapping, or a ``UserError`` naming what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"Spec file '{path}' does not exist; pass the path of a benchmark YAML.")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise UserError(
            f"Spec file '{path}' is not UTF-8 text (byte {err.object[err.start]:#x} at offset "
            f"{err.start}); save it as UTF-8."
        ) from None
    except yaml.YAMLError as err:
        raise UserError(f"Spec file '{path}' is not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise UserError(f"Spec file '{path}' must hold a mapping at the top level.")
    return raw


def load_spec(path: str | Path, overrides: list[str] | None = None) -> Spec:
    raw = read_spec_file(path)
    # Harness sections (tasks/spec/sections.py) describe how to run a workload, not the workload.
    raw = {k: v for k, v in raw.items() if k not in ("sweep", "schedule")}
    raw = apply_overrides(raw, overrides or [])
    return parse_spec(raw, f"'{path}'")
