"""Every metric key is spelled in ``tasks/measure/keys.py`` only (issue 42 item 5): a production
module that writes ``"quality.accuracy"`` or ``f"floor.{stage}.fraction"`` itself drifts the day
the key is renamed. The scan reads every string constant and f-string of flows/, tasks/ and
dashboards/ (keys.py aside) and flags one that is a catalogued metric key or fills a key family
(an f-string whose fixed parts match a catalogued key with one placeholder per dotted part)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tasks.measure import keys as K
from tests.repo import REPO

PRODUCTION = ("flows", "tasks", "dashboards")
# An f-string is a key family only when its first dotted part is literal; ``run.{key}`` is a spec
# key (the spec's sections share no name with a metric family but run.*, whose metric keys are
# spelled whole)
SPEC_SECTIONS = ("run", "model", "task", "source", "schema")


def _instances(entry: str) -> set[str]:
    """A catalogue entry as keys: ``<part>`` placeholders filled with ``x``, an optional
    ``[.train]`` both with and without its contents."""
    filled = re.sub(r"<[^>]+>", "x", entry)
    return {re.sub(r"\[([^\]]*)\]", r"\1", filled), re.sub(r"\[[^\]]*\]", "", filled)}


def _metric_keys() -> set[str]:
    names = {v for k, v in vars(K).items() if k.isupper() and isinstance(v, str) and "." in v}
    return names | {key for entry, _ in K.CATALOGUE for key in _instances(entry)}


def _literals(path: Path) -> list[tuple[int, str, bool]]:
    """(line, text, is_fstring) of every string constant and f-string in ``path``; an f-string's
    placeholders become ``{}``."""
    out: list[tuple[int, str, bool]] = []
    tree = ast.parse(path.read_text(), str(path))
    in_fstring: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            out.append((node.lineno, str(text), True))
            in_fstring.update(id(v) for v in node.values)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in in_fstring:
            out.append((node.lineno, node.value, False))
    return out


def _family_like(text: str) -> bool:
    first = text.split(".", 1)[0]
    return bool(first) and "{}" not in first and first not in SPEC_SECTIONS


def _offences(keys: set[str]) -> list[str]:
    offences = []
    for root in PRODUCTION:
        for path in sorted((REPO / root).rglob("*.py")):
            if path == REPO / "tasks" / "measure" / "keys.py":
                continue
            for line, text, fstring in _literals(path):
                if not fstring and text in keys:
                    offences.append(f"{path.relative_to(REPO)}:{line}: {text!r}")
                elif fstring and "{}" in text and "." in text and _family_like(text):
                    pattern = re.compile("^" + re.escape(text).replace(r"\{\}", r"[A-Za-z0-9_]+") + "$")
                    if any(pattern.match(k) for k in keys):
                        offences.append(f"{path.relative_to(REPO)}:{line}: f{text!r}")
    return sorted(offences)


def test_no_production_module_spells_a_metric_key():
    offences = _offences(_metric_keys())
    assert offences == [], "spell these through tasks/measure/keys.py:\n" + "\n".join(offences)


def test_the_scan_finds_a_literal_and_a_family(tmp_path, monkeypatch):
    """The scan can fail: a module spelling a key and one filling a family are both flagged."""
    import tests.tasks.measure.test_keys_spelled_once as scan

    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "bad.py").write_text(
        f'A = "{K.QUALITY_ROWS}"\ndef f(stage):\n    return f"floor.{{stage}}.fraction"\n'
    )
    monkeypatch.setattr(scan, "REPO", tmp_path)
    keys = {K.QUALITY_ROWS, K.floor_fraction("compute")}
    assert scan._offences(keys) == [
        f"tasks/bad.py:1: {K.QUALITY_ROWS!r}",
        "tasks/bad.py:3: f'floor.{}.fraction'",
    ]
