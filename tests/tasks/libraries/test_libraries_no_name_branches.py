"""Every library is a plug-in: no module branches on a library's name, on a missing side or on
the reference model's engine type; it asks the ``Library`` or its ``ModelSide`` (tasks/libraries/README.md).

A source scan of tasks/, flows/ and dashboards/ (the AST: strings in docs and comments do not count)."""

from __future__ import annotations

import ast

from tasks.libraries import LIBRARIES
from tests.repo import REPO

SCANNED = ("tasks", "flows", "dashboards")
# Known and not yet a library's declared capability (none today: the budget's default grid became
# Library.budget_grid). Each entry must still be flagged, so a fixed one leaves this list.
KNOWN: dict[str, int] = {}


def branches(source: str) -> list[str]:
    """Each ``line: code`` of ``source`` that compares a library's name, tests a side against
    None, or asks ``isinstance(..., Engine)``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            texts = [ast.unparse(o) for o in operands]
            names = [o.value for o in operands if isinstance(o, ast.Constant) and isinstance(o.value, str)]
            on_library = any(n in LIBRARIES for n in names) and any("library" in t for t in texts)
            on_side = any(isinstance(o, ast.Constant) and o.value is None for o in operands) and any(
                t == "side" or t.endswith(".side") for t in texts
            )
            if on_library or on_side:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "isinstance" and len(node.args) == 2:
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            if any(ast.unparse(k).split(".")[-1] == "Engine" for k in kinds):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_flags_each_kind_of_branch():
    planted = """
def f(spec, chain, engine, library):
    if spec.model.library == "reference":
        pass
    if library.name != 'relflow':
        pass
    if chain.side is None or side is not None:
        pass
    if isinstance(engine, Engine) or isinstance(engine, (int, compute.Engine)):
        pass
    if job["role"] == "reference" or engine is None:  # not a library's name; not a side
        pass
"""
    assert [line.split(":")[0] for line in branches(planted)] == ["3", "5", "7", "7", "9", "9"]


def test_no_module_branches_on_a_library():
    found = {}
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            hits = branches(path.read_text())
            if hits:
                found[str(path.relative_to(REPO))] = hits
    unexpected = {p: h for p, h in found.items() if len(h) != KNOWN.get(p)}
    assert not unexpected, f"ask the Library or its ModelSide instead (tasks/libraries/README.md): {unexpected}"
    assert set(found) == set(KNOWN), f"fixed: remove from KNOWN {set(KNOWN) - set(found)}"
