"""tasks/ has a direction (issue 42 item 1): no two of its folders import each other.

The layers contract in pyproject.toml (checked by ``lint-imports`` in .ci/run) orders the
folders; this is the folder-level view a reviewer asks for: every import between two
top-level folders of ``tasks/``, function-level and ``TYPE_CHECKING`` imports included, and no
pair tied both ways. It reads the graph with grimp, the library import-linter is built on.
"""

from __future__ import annotations

import sys
from collections import defaultdict

import grimp

from tests.repo import REPO


def folder_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def folder_edges(graph: grimp.ImportGraph) -> dict[tuple[str, str], set[str]]:
    edges: dict[tuple[str, str], set[str]] = defaultdict(set)
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            a, b = folder_of(importer), folder_of(imported)
            if imported.startswith("tasks.") and a and b and a != b:
                edges[(a, b)].add(f"{importer} -> {imported}")
    return edges


def tied_pairs(edges: dict[tuple[str, str], set[str]]) -> list[str]:
    return [
        f"{a} <-> {b}: {sorted(edges[(a, b)])[0]}; {sorted(edges[(b, a)])[0]}"
        for (a, b) in sorted(edges)
        if a < b and (b, a) in edges
    ]


def tasks_graph() -> grimp.ImportGraph:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return grimp.build_graph("tasks", cache_dir=None)


def test_no_two_tasks_folders_import_each_other() -> None:
    edges = folder_edges(tasks_graph())
    folders = {a for a, _ in edges} | {b for _, b in edges}
    assert {"run", "libraries", "stages", "measure"} <= folders  # the graph was read
    tied = tied_pairs(edges)
    assert not tied, "tasks/ folders that import each other:\n" + "\n".join(tied)


def test_the_check_sees_a_planted_upward_import() -> None:
    graph = tasks_graph()
    graph.add_import(importer="tasks.measure.clock", imported="tasks.run.chain")  # a primitive reaching up
    tied = tied_pairs(folder_edges(graph))
    assert any(t.startswith("measure <-> run: tasks.measure.clock -> tasks.run.chain") for t in tied), tied
