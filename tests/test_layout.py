"""Every test file is named after what it tests (tests/README.md, issue 42 item 5).

``tests/<folder>/test_<name>.py`` tests ``<folder>/``: ``<name>`` is one of its modules
(``<folder>/<name>.py``), one of its packages (``<folder>/<name>/``) or the folder's own package
(``tests/tasks/spec/test_spec.py``), optionally followed by ``_<aspect>`` when that name is taken
(``test_compute_bucketing.py`` beside ``test_compute.py``; the file's docstring says why). A file
that tests no single module is on ``ALLOWED`` below, with its reason; ``tests/README.md`` lists
the same names. Test modules' basenames are unique (pytest imports them by basename).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.repo import REPO

TESTS = REPO / "tests"

# Files that test no single module, each with its reason (tests/README.md: "Named after a behaviour").
ALLOWED = {
    "test_readme.py": "README.md and the folder READMEs against the tree",
    "test_sigterm.py": "tests/sigterm.py, the test session's own SIGTERM handling",
    "test_layout.py": "this rule",
    "dashboards/test_mlflow_ui.py": "MLflow's own UI in a browser on our runs: no module of ours renders it",
    "dashboards/test_mlflow_trace_view.py": "MLflow's own trace view in a browser on a request run's traces",
    "flows/test_relbench_leakage.py": "a leak planted in a RelBench folder, through every stage: no single module",
    "flows/test_relbench_database.py": "a RelBench task read from a database, through every stage: no single module",
}


def all_test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)


def names_under(folder: Path) -> set[str]:
    """What a test in ``tests/<folder>/`` may be named after: modules, packages, the folder itself."""
    if not folder.is_dir():
        return set()
    names = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    if (folder / "__init__.py").is_file():
        names.add(folder.name)
    return names


def maps_to_a_module(path: Path) -> bool:
    rel = path.relative_to(TESTS)
    if rel.parent == Path("."):
        return False  # tests/ itself mirrors no package: root test files are on ALLOWED
    name = path.stem.removeprefix("test_")
    return any(name == m or name.startswith(f"{m}_") for m in names_under(REPO / rel.parent))


def test_every_test_file_is_named_after_a_module_or_allowed() -> None:
    stray = [
        str(p.relative_to(TESTS))
        for p in all_test_files()
        if not maps_to_a_module(p) and p.relative_to(TESTS).as_posix() not in ALLOWED
    ]
    assert not stray, (
        f"test files named after no module of the folder they mirror: {stray}; rename each to "
        "test_<module>.py or test_<module>_<aspect>.py (tests/README.md), or, if it tests no single "
        "module, add it to ALLOWED with its reason and to tests/README.md"
    )


def test_the_lists_hold_only_files_that_need_them() -> None:
    here = {p.relative_to(TESTS).as_posix(): p for p in all_test_files()}
    gone = [name for name in ALLOWED if name not in here]
    assert not gone, f"listed but not on disk (renamed? delete the line): {gone}"
    mapped = [name for name in ALLOWED if maps_to_a_module(here[name])]
    assert not mapped, f"on ALLOWED but named after a module (delete the line): {mapped}"


def test_allowed_files_are_listed_in_the_tests_readme() -> None:
    readme = (TESTS / "README.md").read_text()
    missing = [name for name in ALLOWED if name not in readme]
    assert not missing, f"tests/README.md does not list {missing}"


def test_aspect_names_only_where_the_plain_name_is_taken() -> None:
    """``test_<m>_<aspect>.py`` when ``test_<m>.py`` exists (in any folder: basenames are unique), or
    ``test_<package>_<module>.py`` for a module of a package in the folder (``test_relflow_side.py``)."""
    files = all_test_files()
    taken = {p.name for p in files}
    loose = []
    for p in files:
        rel = p.relative_to(TESTS)
        if rel.parent == Path(".") or rel.as_posix() in ALLOWED:
            continue
        folder, name = REPO / rel.parent, p.stem.removeprefix("test_")
        names = names_under(folder)
        if name in names:
            continue
        if not any(
            f"test_{m}.py" in taken or (folder / m / f"{name.removeprefix(m + '_')}.py").is_file()
            for m in names
            if name.startswith(f"{m}_")
        ):
            loose.append(rel.as_posix())
    assert not loose, f"aspect names where the module's own name is free (rename to test_<module>.py): {loose}"


def test_test_module_basenames_are_unique() -> None:
    twice = [name for name, n in Counter(p.name for p in all_test_files()).items() if n > 1]
    assert not twice, f"pytest imports test modules by basename; these are used twice: {twice}"


def test_the_rule_rejects_what_it_should() -> None:
    assert maps_to_a_module(TESTS / "tasks" / "stages" / "test_compute.py")
    assert maps_to_a_module(TESTS / "tasks" / "stages" / "test_compute_bucketing.py")
    assert maps_to_a_module(TESTS / "tasks" / "spec" / "test_spec.py")  # the folder's package
    assert maps_to_a_module(TESTS / "tasks" / "libraries" / "test_relflow.py")  # a package in it
    assert not maps_to_a_module(TESTS / "tasks" / "stages" / "test_computer.py")
    assert not maps_to_a_module(TESTS / "tasks" / "stages" / "test_cold_start.py")
    assert not maps_to_a_module(TESTS / "tasks" / "nowhere" / "test_compute.py")
    assert not maps_to_a_module(TESTS / "test_readme.py")
