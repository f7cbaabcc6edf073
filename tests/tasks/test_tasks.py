"""tasks/ has a direction (issue 42 item 1): no folders import each other, directly or round a cycle.

The layers contracts in pyproject.toml (checked by ``lint-imports`` in .ci/run) order the
folders; this is the folder-level view a reviewer asks for: every import between two
top-level folders of ``tasks/``, and between two folders of the composition layer
``tasks/run/``, function-level and ``TYPE_CHECKING`` imports included, and no cycle among them
(a pair tied both ways, or a longer ring such as run/checks -> run/distributed ->
run/scenarios -> run/checks, which a pairwise check misses). It reads the graph with grimp,
the library import-linter is built on.
"""

from __future__ import annotations

import sys
from collections import defaultdict

import grimp

from tests.repo import REPO


def folder_of(module: str, package: str = "tasks") -> str:
    """The folder (or module) right under ``package`` that holds ``module``; "" outside it."""
    if not module.startswith(package + "."):
        return ""
    return module[len(package) + 1 :].split(".")[0]


def folder_edges(graph: grimp.ImportGraph, package: str = "tasks") -> dict[tuple[str, str], set[str]]:
    edges: dict[tuple[str, str], set[str]] = defaultdict(set)
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            a, b = folder_of(importer, package), folder_of(imported, package)
            if a and b and a != b:
                edges[(a, b)].add(f"{importer} -> {imported}")
    return edges


def cycles(edges: dict[tuple[str, str], set[str]]) -> list[list[str]]:
    """The folders on some cycle, grouped by the cycle they share (strongly connected sets)."""
    nodes = {a for a, _ in edges} | {b for _, b in edges}
    out: dict[str, set[str]] = {n: {b for a, b in edges if a == n} for n in nodes}

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for b in out[todo.pop()]:
                if b not in seen:
                    seen.add(b)
                    todo.append(b)
        return seen

    reachable = {n: reach(n) for n in nodes}
    groups = {frozenset({n} | {m for m in reachable[n] if n in reachable[m]}) for n in nodes if n in reachable[n]}
    return sorted(sorted(g) for g in groups)


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
    assert not cycles(edges), f"tasks/ folders on an import cycle: {cycles(edges)}"


def test_no_cycle_among_the_composition_layers_folders() -> None:
    edges = folder_edges(tasks_graph(), "tasks.run")
    folders = {a for a, _ in edges} | {b for _, b in edges}
    assert {"record", "scenarios", "checks", "chain"} <= folders  # the graph was read
    assert not cycles(edges), f"tasks/run folders on an import cycle: {cycles(edges)}; " + "; ".join(tied_pairs(edges))


def test_the_check_sees_a_planted_upward_import() -> None:
    graph = tasks_graph()
    graph.add_import(importer="tasks.measure.clock", imported="tasks.run.chain")  # a primitive reaching up
    tied = tied_pairs(folder_edges(graph))
    assert any(t.startswith("measure <-> run: tasks.measure.clock -> tasks.run.chain") for t in tied), tied


def test_the_check_sees_a_planted_ring_of_three() -> None:
    graph = tasks_graph()
    # the ring this check was written for: checks -> distributed -> scenarios -> checks
    graph.add_import(importer="tasks.run.checks.plan", imported="tasks.run.distributed.launch")
    edges = folder_edges(graph, "tasks.run")
    assert not tied_pairs(edges)  # no pair is tied both ways, so only the cycle check sees it
    assert cycles(edges) == [["checks", "distributed", "scenarios"]]
