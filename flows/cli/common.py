"""Plumbing shared by every ``relflow-bench`` command: consoles, error endings, overrides.

One exit-code convention for all commands: 0 done, 2 bad input (``UserError``: one paragraph,
no traceback unless ``--debug``), 1 any other failure, 130 interrupted (Ctrl-C, SIGTERM).
Commands add their own codes on top (3 ``run --strict`` INVALID, 4 ``history
--fail-on-regression``). Prefect is imported only by the commands that need it.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tasks.runtime.errors import UserError
from tasks.runtime.masking import mask_secrets

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
DEFAULT_SPEC = BENCHMARKS / "tpch_orders.yaml"
INTERRUPTED_EXIT = 130

# soft_wrap: a path or link is never broken across lines (piped output is 80 columns wide),
# so it can be copied, clicked and parsed; tables still fit the width.
console = Console(stderr=True, soft_wrap=True)  # progress, notes and errors
out = Console(soft_wrap=True)  # the command's result (tables, paths), so it can be piped


def show_table(table: Table) -> None:
    """A result table on stdout. On a terminal it fits the terminal; piped or redirected, it is
    printed at its own full width, so no metric key, run id or path is wrapped or cut to fit 80
    columns (``relflow-bench compare A B | grep compute.steady_rows_per_s`` finds the row). The
    width is measured per table: ``COLUMNS`` read when this module was imported must not decide
    it either."""
    if out.is_terminal:
        out.print(table)
        return
    width = Console(width=100_000, file=io.StringIO()).measure(table).maximum
    text = io.StringIO()
    Console(width=max(width, 1), file=text, color_system=None).print(table)
    # through ``out`` (its file, its capture), as text it must not wrap again
    out.print(text.getvalue(), end="", markup=False, highlight=False, emoji=False, soft_wrap=True)


def fail(err: BaseException, debug: bool) -> NoReturn:
    """End a command on ``err``: exit 2 for bad input, 1 otherwise (re-raise with --debug)."""
    if debug:
        raise err
    message = escape(mask_secrets(str(err)))  # a library's error may quote a URI with its secret
    if isinstance(err, UserError):
        console.print(f"[bold red]error:[/] {message}")  # "[us, tz=UTC]" is not markup
        raise typer.Exit(UserError.exit_code)
    console.print(f"[bold red]failed:[/] {type(err).__name__}: {message}\n(rerun with --debug for the traceback)")
    raise typer.Exit(1)


def handle_run_error(err: BaseException, debug: bool, interrupted: str) -> NoReturn:
    """Ending of the run-like commands: exit 130 on interrupts (saying what was cleaned up),
    else as ``fail``."""
    if isinstance(err, typer.Exit):
        raise err
    if isinstance(err, KeyboardInterrupt | SystemExit) and not debug:
        console.print(f"[bold red]interrupted[/]: {interrupted}")
        raise typer.Exit(INTERRUPTED_EXIT) from None
    fail(err, debug)


def pairs(items: list[str], flag: str) -> dict[str, str]:
    """``["k=v", ...]`` from a repeatable option -> ``{"k": "v"}``; bad items name ``flag``."""
    parsed = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"{flag} '{item}' must look like key=value.")
        k, v = item.split("=", 1)
        parsed[k.strip()] = v
    return parsed


def quiet_prefect(debug: bool) -> None:
    """Prefect's log level, set before Prefect is imported (it reads settings on import)."""
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO" if debug else "WARNING")


def start_run_command(debug: bool, set_: list[str] | None, scale: float | None) -> list[str]:
    """Start of the run-like commands (run, sweep): quiet logs, interrupts end runs KILLED, the overrides
    (``--scale S`` is ``--set source.generate.tpch.scale=S``)."""
    quiet_prefect(debug)
    from tasks.runtime import interrupts

    # SIGTERM/SIGINT, to the process or its group: exit 130 within seconds, runs KILLED
    interrupts.install()
    overrides = list(set_ or [])
    if scale is not None:
        overrides.append(f"source.generate.tpch.scale={scale}")
    return overrides


def install_interrupts(message: str | None = None) -> None:
    """SIGTERM/SIGINT end the command as they end ``run``: exit 130 within seconds, MLflow runs
    it holds ended KILLED, registered cleanups done (tasks/runtime/interrupts.py)."""
    from tasks.runtime import interrupts

    interrupts.install(message or "the command's MLflow runs were ended KILLED and temporary files removed.")


@contextmanager
def interrupted_removes(cleanup: Callable[[], None]) -> Iterator[None]:
    """The file-writing commands' interrupt handling, the same as ``run``'s
    (tasks/runtime/interrupts.py): SIGTERM/SIGINT exit 130 within seconds with ``cleanup``
    (the command's temporary files) done first; an error inside also runs ``cleanup``."""
    from tasks.runtime import interrupts

    install_interrupts("the command's temporary files were removed.")
    forget = interrupts.on_interrupt(cleanup)
    try:
        yield
    except BaseException:
        cleanup()
        raise
    finally:
        forget()


class _HideUserErrors(logging.Filter):
    """Prefect's engines log a task's exception with its traceback; for bad input the CLI's
    one-paragraph message is the whole story, so those records are dropped (not with --debug)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, UserError) and "UserError" not in record.getMessage()


def hide_user_error_logs() -> None:
    """Filter Prefect's loggers and handlers, and keep MLflow's INFO lines (migrations, system
    metrics) out of the display; call after both configured their logging on import."""
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    hide = _HideUserErrors()
    names = [n for n in logging.root.manager.loggerDict if n.startswith("prefect")]
    for logger in [logging.getLogger(n) for n in names] + [logging.getLogger()]:
        logger.addFilter(hide)
        for handler in logger.handlers:
            handler.addFilter(hide)
