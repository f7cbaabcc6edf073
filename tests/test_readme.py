"""README.md tells the truth about the house: its tree is the folders on disk, its table links
every folder README, its set-up commands are the ones CI runs, and it stays short."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.repo import REPO

README = REPO / "README.md"
MAX_LINES = 250
# Folders whose code folders must all appear in the tree (tests/: its top level only).
CODE_ROOTS = ("flows", "tasks", "model", "dashboards", "benchmarks")
# Files a newcomer must find first: the one stage chain and the offline passes.
KEY_FILES = {"tasks/run/chain.py", "tasks/run/scenarios/offline.py", "tasks/run/scenarios/workload.py"}
INDENT = 4
# One tree line: indentation, a name (folders end in "/"), at least two spaces, the comment.
TREE_LINE = re.compile(r"^(?P<indent> *)(?P<name>\S+)(?: {2,}(?P<comment>\S.*))?$")


def block(text: str, name: str) -> str:
    begin = re.search(rf"<!-- {name}:begin[^>]*-->", text)
    end = text.find(f"<!-- {name}:end -->")
    assert begin and end > begin.end(), f"README.md lost its <!-- {name}:begin/end --> markers"
    return text[begin.end() : end]


def parse_tree(text: str) -> dict[str, str | None]:
    """``{path: comment}`` for every line of the README's tree (folders end in "/")."""
    body = block(text, "tree").strip()
    assert body.startswith("```") and body.endswith("```"), "the tree is one fenced code block"
    entries: dict[str, str | None] = {}
    parents: list[str] = []
    for line in body.splitlines()[1:-1]:
        if not line.strip():
            continue
        m = TREE_LINE.match(line)
        assert m, f"tree line not 'name  comment': {line!r}"
        indent = len(m["indent"])
        assert indent % INDENT == 0 and indent // INDENT <= len(parents), f"bad indentation: {line!r}"
        parents = parents[: indent // INDENT]
        path = "".join(parents) + m["name"]
        entries[path] = m["comment"]
        if m["name"].endswith("/"):
            parents.append(m["name"])
    return entries


def code_folders() -> list[str]:
    """Every folder that holds Python code under the code roots, plus tests/ and its top level."""
    found = set()
    for root in CODE_ROOTS:
        for py in (REPO / root).rglob("*.py"):
            if "__pycache__" in py.parts:
                continue
            rel = py.parent.relative_to(REPO)
            found.update(str(Path(*rel.parts[:i])) + "/" for i in range(1, len(rel.parts) + 1))
    found.add("tests/")
    found.update(
        f"tests/{d.name}/"
        for d in (REPO / "tests").iterdir()
        if d.is_dir() and d.name != "__pycache__" and any(d.rglob("*.py"))
    )
    return sorted(found)


def missing_from_tree(tree: dict[str, str | None]) -> list[str]:
    return [f for f in code_folders() if f not in tree]


def not_on_disk(tree: dict[str, str | None]) -> list[str]:
    bad = []
    for path in tree:
        if path.endswith("/"):
            if not (REPO / path).is_dir():
                bad.append(path)
        elif not (REPO / path).is_file():
            bad.append(path)
    return bad


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines; keep it under {MAX_LINES} and move reference to a folder README"


def test_every_code_folder_is_in_the_tree_with_a_comment():
    tree = parse_tree(README.read_text())
    assert not missing_from_tree(tree), f"folders missing from README.md's tree: {missing_from_tree(tree)}"
    uncommented = [p for p, c in tree.items() if not c]
    assert not uncommented, f"tree entries without a comment: {uncommented}"


def test_everything_in_the_tree_is_on_disk():
    assert not not_on_disk(parse_tree(README.read_text())), "README.md's tree names paths that do not exist"


def test_the_tree_check_catches_a_missing_and_an_invented_folder():
    text = README.read_text()
    without_stages = re.sub(r"\n    stages/ .*\n(        \S.*\n)*", "\n", text)
    assert "tasks/stages/" in missing_from_tree(parse_tree(without_stages))
    invented = text.replace("    runtime/ ", "    launchers/          invented\n    runtime/ ")
    assert not_on_disk(parse_tree(invented)) == ["tasks/launchers/"]


def readme_links(text: str) -> list[str]:
    return re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)


def test_every_folder_readme_is_linked_from_the_table_and_every_link_resolves():
    table = block(README.read_text(), "readmes")
    linked = set(readme_links(table))
    folder_readmes = {
        str(p.relative_to(REPO))
        for p in REPO.rglob("README.md")
        if p != README
        and not {"data", "outputs", "__pycache__"} & set(p.relative_to(REPO).parts)
        # tools' own folders (.git, .pytest_cache, .venv, .mypy_cache) are not the house
        and not any(part.startswith(".") for part in p.relative_to(REPO).parts)
    }
    assert folder_readmes - linked == set(), f"folder READMEs missing from README.md's table: {folder_readmes - linked}"
    for doc in [README, *(REPO / r for r in folder_readmes)]:
        for link in readme_links(doc.read_text()):
            if "://" in link:
                continue
            assert (doc.parent / link).exists(), f"{doc.relative_to(REPO)} links to {link}, which does not exist"


def setup_commands() -> tuple[str, list[str]]:
    """(the main-job command, the test commands) from the README's set-up section."""
    text = README.read_text()
    section = text[text.index("## Set-up") : text.index("\n## ", text.index("## Set-up") + 1)]
    commands = [line.strip().split("  #")[0].strip() for line in section.splitlines() if line.startswith("    ")]
    assert len(commands) == 3, f"the set-up section should show 3 command lines, found {commands}"
    return commands[0], commands[1:]


def test_setup_commands_are_the_ones_ci_runs():
    main_job, (apt, tests) = setup_commands()
    assert main_job == "python -m pip install -e . && relflow-bench run"
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    # CI runs the README's test command, step by step, in the same order
    steps = [s.strip() for s in tests.split("&&")]
    where = [ci.index(s) if s in ci else -1 for s in steps]
    assert -1 not in where and where == sorted(where), f".ci/run does not run {steps} in order"
    # and installs the same system packages when they are missing
    packages = shlex.split(apt)[shlex.split(apt).index("-y") + 1 :]
    ci_text = "\n".join(ci)
    for p in packages:
        assert f"missing+=({p})" in ci_text, f".ci/run does not install {p}, which the README's set-up names"


@pytest.mark.parametrize("path", sorted(KEY_FILES))
def test_key_files_exist_and_are_described_where_they_live(path: str):
    assert (REPO / path).is_file(), path
    folder_readme = REPO / Path(path).parent / "README.md"
    assert Path(path).name in folder_readme.read_text(), f"{folder_readme.relative_to(REPO)} does not describe {path}"
