"""The CLI modules form no import cycle: ``flows/cli/app.py`` registers the commands of
``sweep``, ``serve``, ``reports`` and ``backends``; those and ``app`` share ``common``, which imports
none of them. Read from the source (no imports), so the test is instant."""

from __future__ import annotations

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parents[3] / "flows" / "cli"


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_no_cli_module_imports_the_app_and_common_imports_no_command():
    for name in ("common", "sweep", "serve", "reports", "backends"):
        assert "flows.cli.app" not in imported_modules(CLI / f"{name}.py"), name
    assert not {"flows.cli.sweep", "flows.cli.serve", "flows.cli.reports", "flows.cli.backends"} & imported_modules(
        CLI / "common.py"
    )


def test_no_private_names_cross_module_boundaries():
    for path in CLI.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.split(".")[0] in ("flows", "tasks", "dashboards", "model")
            ):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports {private} from {node.module}"
