"""Metric keys are spelled once (tasks/measure/keys.py), and README's list is that catalogue."""

from __future__ import annotations

import re
from pathlib import Path

from tasks.measure import keys as K
from tasks.measure.records import PhaseTimings, RunResult

REPO = Path(__file__).resolve().parents[3]


def readme_block() -> list[str]:
    text = (REPO / "README.md").read_text()
    start, end = text.index(K.README_BEGIN), text.index(K.README_END)
    return [line for line in text[start + len(K.README_BEGIN) : end].strip().splitlines() if line]


def test_readme_metric_list_is_the_catalogue():
    assert readme_block() == K.readme_lines(), (
        "README's metric list differs from tasks/measure/keys.py CATALOGUE; regenerate it with "
        "python -c 'from tasks.measure.keys import readme_lines; print(*readme_lines(), sep=chr(10))'"
    )


def test_every_key_a_full_result_logs_is_catalogued():
    r = RunResult()
    for phase in K.PHASES:
        for st in r.stages[phase].values():
            st.add(1.0, 10)
    r.train, r.predict = PhaseTimings(1), PhaseTimings(1)
    for t in (r.train, r.predict):
        for s in (2.0, 1.0, 1.0, 1.0):
            t.record(s, 4)
    r.recompiles, r.graph_breaks = {"train": 0, "predict": 1}, {"train": 0, "predict": 0}
    r.repeat_predict_rows_per_s = r.repeat_steady_rows_per_s = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    r.overflow_dropped = {"lineitem": 3}
    r.quality = {"rows": 4.0, "accuracy": 0.5, "majority_rate": 0.5}
    missing = [k for k in r.metrics() if not K.documented(k)]
    assert not missing, f"keys not in tasks/measure/keys.py CATALOGUE: {missing}"


KEY_LITERAL = re.compile(
    r"""["'](?:stage|e2e|compute|data|device|memory|output|quality|harness|host)"""
    r"""\.[a-z_]+(?:\.[a-z_0-9]+)*["']"""
)


def test_no_other_module_spells_a_metric_key():
    offenders = []
    for folder in ("flows", "tasks", "dashboards", "benchmarks"):
        for path in (REPO / folder).rglob("*.py"):
            if path.name == "keys.py":
                continue
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if KEY_LITERAL.search(line) and not line.lstrip().startswith("#"):
                    offenders.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert not offenders, "metric keys spelled outside tasks/measure/keys.py:\n" + "\n".join(offenders)
