"""Reading a spec: the YAML file, ``--set`` overrides, and validation errors as one paragraph naming each key.

YAML is read bounded, before anything else looks at it: a 1.4 KB document of nested
aliases (a "billion laughs") expands exponentially and took 19.6 GB in ten minutes. So
aliases (``*name``, and with them ``<<`` merge keys) are refused, as are files over
``MAX_SPEC_BYTES`` and nesting deeper than ``MAX_SPEC_DEPTH``: a spec is small and flat
enough to write out, and each limit's message names it. An integer longer than
``MAX_SPEC_INT_DIGITS`` is refused too: Python's own guard (4,300 digits) raised a bare
``ValueError``, which ended the command with exit 1 instead of naming the value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tasks.runtime.errors import UserError
from tasks.spec.workload import Spec

MAX_SPEC_BYTES = 1_000_000  # the shipped specs are under 4 KB
MAX_SPEC_DEPTH = 64  # nested mappings/lists; the deepest shipped spec nests about 12
MAX_SPEC_INT_DIGITS = 100  # characters of one integer: far beyond any count or seed


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses aliases and nesting beyond ``MAX_SPEC_DEPTH``."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise UserError(
                f"YAML aliases are not allowed in a spec ('*{event.anchor}' at line "
                f"{event.start_mark.line + 1}): they can expand without bound. Write the values out."
            )
        self._depth += 1
        try:
            if self._depth > MAX_SPEC_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise UserError(
                    f"the YAML nests deeper than {MAX_SPEC_DEPTH} levels (MAX_SPEC_DEPTH) at line "
                    f"{mark.line + 1}; a spec is a few levels of sections."
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: Any) -> Any:
        if len(node.value) > MAX_SPEC_INT_DIGITS:
            raise UserError(
                f"the integer at line {node.start_mark.line + 1} is {len(node.value):,} characters long, over "
                f"the {MAX_SPEC_INT_DIGITS}-character limit (MAX_SPEC_INT_DIGITS); write a number of usual size."
            )
        return super().construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def load_yaml(text: str, what: str) -> Any:
    """``text`` parsed as YAML within the limits above (``what`` names it in messages)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_SPEC_BYTES:
        raise UserError(
            f"{what} is {size:,} bytes, over the {MAX_SPEC_BYTES:,}-byte limit for a spec "
            "(MAX_SPEC_BYTES); a spec describes a workload, its data lives in source.tables."
        )
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except UserError as err:
        raise UserError(f"{what}: {err}") from None
    except yaml.YAMLError as err:
        raise UserError(f"{what} is not valid YAML: {err}") from None


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
        _set_path(raw, branch_path(raw, key.strip()), load_yaml(text, f"--set {key.strip()}"))
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
    if path.stat().st_size > MAX_SPEC_BYTES:  # before reading: the file may be anything
        raise UserError(
            f"Spec file '{path}' is {path.stat().st_size:,} bytes, over the {MAX_SPEC_BYTES:,}-byte "
            "limit for a spec (MAX_SPEC_BYTES); pass the benchmark YAML, not a data file."
        )
    try:
        raw = load_yaml(path.read_text(encoding="utf-8"), f"Spec file '{path}'")
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


def complete_and_override(raw: dict[str, Any], overrides: list[str], spec_dir: Path) -> dict[str, Any]:
    """``--set`` overrides applied around the RelBench derivation (tasks/spec/relbench.py): those
    of ``name`` and ``source`` first (they choose the folder and task), then the schema and task
    are derived where the spec leaves them out, then the rest (which may address derived branches)."""
    from tasks.spec.relbench import complete

    first = [o for o in overrides if o.split("=", 1)[0].strip().split(".", 1)[0] in ("name", "source")]
    rest = [o for o in overrides if o not in first]
    raw = apply_overrides(raw, first)
    return apply_overrides(complete(raw, spec_dir), rest)


def load_spec(path: str | Path, overrides: list[str] | None = None) -> Spec:
    raw = read_spec_file(path)
    # Harness sections (tasks/spec/sections.py) describe how to run a workload, not the workload.
    raw = {k: v for k, v in raw.items() if k not in ("sweep", "schedule")}
    raw = complete_and_override(raw, overrides or [], Path(path).resolve().parent)
    return parse_spec(raw, f"'{path}'")
