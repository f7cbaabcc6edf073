"""Metric keys are spelled once (tasks/measure/keys.py): the generated list in
tasks/measure/README.md is that catalogue, and every metric key any doc mentions is in it.

"Any doc" is README.md, every folder README, and the docstrings and comments of the source
folders. A doc key may use the shorthand the docs use: ``a.b.c|d`` (c or d), ``<stage>``
style placeholders and ``*``; each spelled-out alternative must be catalogued.

Regenerate the list after editing CATALOGUE (from the repository root):
``python tests/tasks/measure/test_keys.py``.
"""

from __future__ import annotations

import ast
import io
import itertools
import re
import sys
import tokenize
from pathlib import Path

if __name__ == "__main__":  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tasks.measure import keys as K  # noqa: E402
from tasks.measure.records import (  # noqa: E402
    CompileCounters,
    DataReport,
    EngineReport,
    OfflineReport,
    PhaseTimings,
    RunResult,
    StageTable,
)
from tests.repo import REPO  # noqa: E402

CATALOGUE_README = REPO / "tasks" / "measure" / "README.md"
SOURCE_FOLDERS = ("tasks", "flows", "dashboards", "benchmarks", "model")
# Folders that hold generated or local files, never docs of ours.
SKIP_PARTS = {".git", "data", "outputs", "mlartifacts", "__pycache__", ".venv", "node_modules"}


def readme_block(text: str) -> list[str]:
    start, end = text.index(K.README_BEGIN), text.index(K.README_END)
    return [line for line in text[start + len(K.README_BEGIN) : end].strip().splitlines() if line]


def write_block() -> None:
    """Rewrite the generated list in tasks/measure/README.md from CATALOGUE."""
    text = CATALOGUE_README.read_text()
    start, end = text.index(K.README_BEGIN) + len(K.README_BEGIN), text.index(K.README_END)
    CATALOGUE_README.write_text(text[:start] + "\n" + "\n".join(K.readme_lines()) + "\n" + text[end:])


def test_measure_readme_metric_list_is_the_catalogue():
    assert readme_block(CATALOGUE_README.read_text()) == K.readme_lines(), (
        "tasks/measure/README.md's metric list differs from tasks/measure/keys.py CATALOGUE; "
        "regenerate it with: python tests/tasks/measure/test_keys.py"
    )


def full_result_metrics() -> dict[str, float]:
    """Every key a RunResult with every phase, repeat and quality figure filled in logs."""
    table = StageTable()
    for phase in K.PHASES:
        for st in table[phase].values():
            st.add(1.0, 10)
    r = RunResult(stages=table.report(), data=DataReport(overflow_dropped={"lineitem": 3}))
    train, predict = PhaseTimings(1), PhaseTimings(1)
    for t in (train, predict):
        for s in (2.0, 1.0, 1.0, 1.0):
            t.record(s, 4)
    r.offline = OfflineReport(
        rows_per_s=(1.0, 2.0, 3.0, 4.0, 5.0, 6.0), steady_rows_per_s=(1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
    )
    r.engine = EngineReport(
        predict=predict,
        train=train,
        compute_seconds=1.0,
        worker_startup_seconds=0.0,
        recompiles={"train": 0, "predict": 1},
        graph_breaks={"train": 0, "predict": 0},
        compile=CompileCounters(0, 0, 0),
        compiler_cache="none",
        batch_coordinates=None,
        quality={"rows": 4.0, "accuracy": 0.5, "majority_rate": 0.5},
    )
    return r.metrics()


def test_every_key_a_full_result_logs_is_catalogued():
    missing = [k for k in full_result_metrics() if not K.documented(k)]
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


# Folders whose code must name every metric key through tasks/measure/keys.py.
CODE_FOLDERS = ("tasks", "flows", "dashboards")
KEYS_PY = REPO / "tasks" / "measure" / "keys.py"
# Every key keys.py spells: its module-level string constants and the catalogue's entries.
SPELLED_KEYS = {v for n, v in vars(K).items() if n.isupper() and isinstance(v, str)} | {k for k, _ in K.CATALOGUE}


def spelled_key(value: str) -> bool:
    """A string that is a metric key (or a ``latency.`` key piece, such as the head of
    ``f"latency.request_ms.p{q}"``); prose that mentions a key has a space in it."""
    return value in SPELLED_KEYS or (value.startswith("latency.") and " " not in value)


def key_literals(path: Path, root: Path = REPO) -> list[str]:
    """``file:line: 'value'`` for each string constant in ``path`` that spells a key
    (f-string pieces included: they are ``ast.Constant`` too), in line order."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = sorted(
        (node.lineno, node.col_offset, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and spelled_key(node.value)
    )
    return [f"{path.relative_to(root)}:{line}: {value!r}" for line, _, value in found]


def test_no_module_spells_a_key_keys_py_has():
    offenders = []
    for folder in CODE_FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            if path != KEYS_PY and "__pycache__" not in path.parts:
                offenders += key_literals(path)
    assert not offenders, (
        "metric keys spelled outside tasks/measure/keys.py (use its constant or function):\n" + "\n".join(offenders)
    )


def test_the_key_literal_check_catches_f_string_pieces(tmp_path):
    code = (
        'm = {"latency.requests": 1.0, "e2e.predict.seconds": 2.0}\n'
        'k = f"latency.request_ms.p{q}"\n'
        'why = f"latency.requests {n} < 5"\n'  # prose: has a space
        'ok = f"{K.LATENCY_REQUESTS} {n} < 5"\n'
    )
    path = tmp_path / "probe.py"
    path.write_text(code)
    found = key_literals(path, root=tmp_path)
    assert [f.split(": ", 1)[1] for f in found] == [
        "'latency.requests'",
        "'e2e.predict.seconds'",
        "'latency.request_ms.p'",
    ]


# --- every key the docs mention ------------------------------------------------------------

# Metric namespaces: the first segment of every catalogued key. `run.` is left out (spec keys
# live there too; the one run.* metric is spelled in the generated list only) and so is
# `<key>` (a placeholder, not a namespace).
NAMESPACES = sorted({re.split(r"[./]", k)[0] for k, _ in K.CATALOGUE} - {"run", "<key>", "system"})
# A key mention: a namespace, a dot, then key characters (placeholders, `|`, `*` included).
# Not part of a longer name (module paths `tasks.stages.compute`, files `compute.py`, calls).
DOC_KEY = re.compile(rf"(?<![\w./:$-])((?:{'|'.join(NAMESPACES)})\.[A-Za-z0-9_<>|.*-]*[A-Za-z0-9_>*])(?![\w(/-])")
FILE_SUFFIX = re.compile(r"\.(py|yaml|yml|json|md|html|png|csv|parquet|onnx|ckpt|log|txt)$")
# Placeholder holes that stand for one or more dotted segments; every other hole is one segment.
DOTTED_HOLES = {"<what>", "<key>", "<name>"}
# Holes whose catalogue entry accepts any text: a key that only matches such an entry must also
# name its hole somewhere the catalogue (or a real run) does, so `compute.bogus` fails.
FREE_HOLES = DOTTED_HOLES


def _segments(key: str) -> list[str]:
    """Split on dots outside <...>."""
    return re.findall(r"(?:<[^>]*>|[^.<])+", key)


def spelled_out(key: str) -> list[str]:
    """``a.b|c.d`` -> ``a.b.d``, ``a.c.d`` (alternatives outside <...>, per segment)."""
    options = []
    for seg in _segments(key):
        options.append([seg] if seg.startswith("<") and seg.endswith(">") else seg.split("|"))
    return [".".join(parts) for parts in itertools.product(*options)]


def _entry_regex(entry: str) -> re.Pattern[str]:
    """The catalogue entry as a regex with a named group per free hole (K.documented's holes)."""
    rx, pos, n = "", 0, 0
    for m in re.finditer(r"<[a-z]+>", entry):
        rx += re.escape(entry[pos : m.start()])
        hole = m.group(0)
        if hole in FREE_HOLES:
            rx += rf"(?P<free{n}>[A-Za-z0-9_.|:-]+)"
            n += 1
        elif hole in ("<table>", "<column>"):
            rx += r"[\w -]+"
        else:
            rx += r"[A-Za-z0-9_-]+"
        pos = m.end()
    return re.compile(rf"^{rx}{re.escape(entry[pos:])}$")


ENTRIES = [(k, _entry_regex(k)) for k, _ in K.CATALOGUE]
CATALOGUE_KEYS = {k for k, _ in K.CATALOGUE}


def _calibration_metrics() -> dict[str, float]:
    import torch

    from tasks.stages.calibrate import CalibrationQuality

    q = CalibrationQuality("category", temperature=1.5)
    q.add(torch.tensor([[0.2, 0.8], [0.9, 0.1]]), torch.tensor([1, 0]), torch.tensor([True, True]))
    return {K.quality(k): v for k, v in q.metrics().items()}


# Concrete keys a real run logs; a free hole filled with one of these is named by the code.
LOGGED = set(full_result_metrics()) | set(_calibration_metrics())
CATALOGUE_WORDS = set(re.findall(r"[A-Za-z0-9_]+", " ".join(f"{k} {t}" for k, t in K.CATALOGUE)))


def catalogued(key: str) -> bool:
    """``key`` (no placeholders) is in the catalogue, and every word of a free hole is named
    there (or the key is one a real run logs)."""
    if not K.documented(key):
        return False
    if key in LOGGED:
        return True
    for _, rx in ENTRIES:
        m = rx.match(key)
        if m and all(w in CATALOGUE_WORDS for v in m.groupdict().values() for w in re.split(r"[.|:]", v)):
            return True
    return False


# Candidates for a doc key's holes: every segment (and dotted tail) of a logged or catalogued key.
_KNOWN = LOGGED | {re.sub(r"<[a-z]+>", "x", k) for k in CATALOGUE_KEYS}
ONE_SEGMENT = sorted({s for k in _KNOWN for s in k.split(".")} | {"lineitem", "orders", "o_totalprice", "0"})
DOTTED = sorted(set(ONE_SEGMENT) | {".".join(k.split(".")[i:]) for k in _KNOWN for i in range(1, 4)})


def doc_key_ok(key: str) -> bool:
    """A doc mention is fine when it is a catalogue entry, or some filling of its holes is."""
    if key in CATALOGUE_KEYS:
        return True
    if key.endswith(".") or ".." in key:
        return False
    holes = re.findall(r"<[^>]*>|\*", key)
    if not holes:
        return catalogued(key)
    pools = [DOTTED if h == "*" or h in DOTTED_HOLES else ONE_SEGMENT for h in holes]
    template = re.sub(r"<[^>]*>|\*", "\0", key)
    for filling in itertools.product(*pools):
        parts = template.split("\0")
        candidate = "".join(p + (filling[i] if i < len(filling) else "") for i, p in enumerate(parts))
        if catalogued(candidate):
            return True
    return False


def prefix_ok(key: str) -> bool:
    """A bare family name (`e2e.predict`, `compute.train`) that starts catalogued keys."""
    return "<" not in key and "*" not in key and any(k.startswith(key + ".") for k in CATALOGUE_KEYS)


def doc_files() -> list[Path]:
    files = [p for p in REPO.rglob("README.md") if not SKIP_PARTS & set(p.relative_to(REPO).parts)]
    for folder in SOURCE_FOLDERS:
        files += [p for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(files)


def prose(path: Path) -> str:
    """A doc file's text; of a Python file, its docstrings and comments only (not its code)."""
    text = path.read_text()
    if path.suffix != ".py":
        return text
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append(doc)
    out += [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    return "\n".join(out)


def mentioned_keys(text: str) -> set[str]:
    return {k for k in DOC_KEY.findall(text) if not FILE_SUFFIX.search(k)}


def _relbench_modules() -> set[str]:
    import pkgutil

    import relbench

    return {m.name for m in pkgutil.iter_modules(relbench.__path__)}


# ``relbench.<metric>`` is a key family; ``relbench.load.RelBenchDataset`` is the library's code
RELBENCH_MODULES = _relbench_modules()


def wrong_keys(text: str) -> list[str]:
    bad = []
    for mention in sorted(mentioned_keys(text)):
        if prefix_ok(mention):
            continue
        if mention.startswith("relbench.") and mention.split(".")[1] in RELBENCH_MODULES:
            continue
        bad += [f"{k} (in {mention})" if k != mention else k for k in spelled_out(mention) if not doc_key_ok(k)]
    return bad


def test_every_metric_key_in_the_docs_is_catalogued():
    offenders = []
    for path in doc_files():
        if path.name == "keys.py":  # the catalogue itself
            continue
        offenders += [f"{path.relative_to(REPO)}: {k}" for k in wrong_keys(prose(path))]
    assert not offenders, (
        "metric keys in the docs that tasks/measure/keys.py CATALOGUE does not have (fix the doc, "
        "or add the key to CATALOGUE and regenerate tasks/measure/README.md):\n" + "\n".join(offenders)
    )


def test_the_docs_check_sees_the_readmes_and_the_docstrings():
    files = {str(p.relative_to(REPO)) for p in doc_files()}
    assert {"README.md", "tasks/measure/README.md", "tasks/stages/encode.py"} <= files
    # keys the docs do mention are found (so an empty scan cannot pass for a clean one)
    assert "e2e.predict.rows_per_s" in mentioned_keys((REPO / "README.md").read_text())
    assert "stage.encode.*" in mentioned_keys(prose(REPO / "tasks" / "stages" / "encode.py"))


def test_wrong_doc_keys_are_caught():
    # keys older READMEs listed, a wrong alternative, a made-up figure, a wrong placeholder form
    text = (
        "`e2e.seconds|rows_per_s`, `stage.<stage>.seconds`, `compute.batch_ms.p50|p95|p42`, "
        "`compute.bogus_seconds`, `quality.reference.made_up`, `data.occupancy_typo`, `latency.*`, "
        "`e2e.predict.rows_per_s`, `stage.encode.*`, `quality.uncalibrated.nll|ece|brier`, "
        "see tasks/stages/compute.py and `tasks.stages.compute`"
    )
    assert wrong_keys(text) == [
        "compute.batch_ms.p42 (in compute.batch_ms.p50|p95|p42)",
        "compute.bogus_seconds",
        "data.occupancy_typo",
        "e2e.seconds (in e2e.seconds|rows_per_s)",
        "e2e.rows_per_s (in e2e.seconds|rows_per_s)",
        "quality.reference.made_up",
        "stage.<stage>.seconds",
    ]


if __name__ == "__main__":
    write_block()
    print(f"wrote {len(K.readme_lines())} catalogue lines to {CATALOGUE_README.relative_to(REPO)}")
