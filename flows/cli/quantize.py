"""``relflow-bench quantize``: a checkpoint in lower-precision weight formats.

Two checkpoints, told apart by what the path is:

- a **file** (the reference model's ``.ckpt``): one ``--format``, written beside it, as
  before (``flows/cli/backends.py``, ``model/quantize.py``);
- a **folder** (a relational-transformers checkpoint: a ``model.library:
  relational_transformers`` run's saved ``<output>.ckpt/``, or any local folder in the
  library's layout): every ``--format`` (default fp16, fp8, int8, int4) written in the layout
  the library's loader reads (fp8/int8/int4 by relational-transformers-utils'
  ``quantize_checkpoint``, the quantizer ``rt-quantize`` runs), then each format and the fp32
  source loaded in a fresh process and reported: weight file bytes, load seconds, resident set
  before, peak during and after the load, the parameters' dtypes after it, and the task
  metrics of the spec's held-out rows against the fp16 file
  (tasks/libraries/relational_transformers/formats.py).
"""

from __future__ import annotations

import importlib
import pickle
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from flows.cli.backends import quantize_cmd as quantize_file
from flows.cli.common import DEFAULT_SPEC, handle_run_error, interrupted_removes, out

COMPARED_AGAINST = "fp16"  # every quantized file is compared against the fp16 one (the note's rule)


def quantize_cmd(
    checkpoint: Annotated[
        Path,
        typer.Argument(
            help="An fp32 checkpoint: a train+predict run's .ckpt file, or a relational-transformers "
            "checkpoint folder (model.library relational_transformers)."
        ),
    ],
    fmt: Annotated[
        list[str] | None,
        typer.Option(
            "--format",
            help="fp16 | int8 | int4 | fp8. A .ckpt file: exactly one. An RT folder: repeatable "
            "(default all four; fp16 is always written, the reference the others are compared against).",
        ),
    ] = None,
    out_file: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="A .ckpt file: the output file (default <name>.<format>.ckpt beside it). "
            "An RT folder: the folder for the format folders (default: beside it, <name>.<format>.ckpt).",
        ),
    ] = None,
    spec: Annotated[
        Path, typer.Option(help="RT folder: the spec the checkpoint was trained with (task kind, data).")
    ] = DEFAULT_SPEC,
    set_: Annotated[list[str] | None, typer.Option("--set", help="RT folder: spec override, as for run.")] = None,
    rows: Annotated[
        int, typer.Option(help="RT folder: root keys read for the task metrics (0: no metrics, sizes and loads only).")
    ] = 2000,
    threads: Annotated[int, typer.Option(help="RT folder: torch threads in each measuring process.")] = 1,
    debug: Annotated[bool, typer.Option(help="Show tracebacks.")] = False,
) -> None:
    """Write a checkpoint in quantized weight formats (an RT folder: and measure every format)."""
    if not checkpoint.is_dir():
        if fmt is not None and len(fmt) > 1:
            from flows.cli.common import fail
            from tasks.runtime.errors import UserError

            fail(UserError(f"--format given {len(fmt)} times; a .ckpt file takes exactly one."), debug)
        quantize_file(checkpoint, (fmt or [""])[0], out_file, debug)
        return
    _quantize_rt(checkpoint, fmt, out_file, spec, list(set_ or []), rows, threads, debug)


def _formats(fmt: list[str] | None, known: tuple[str, ...]) -> tuple[str, ...]:
    """The ``--format`` values among the library's weight formats ``known``, in its order."""
    from tasks.runtime.errors import UserError

    chosen = [f.strip() for item in fmt or known for f in item.split(",") if f.strip()]
    bad = [f for f in chosen if f not in known]
    if bad:
        raise UserError(f"--format {bad} unknown; choose from {', '.join(known)}.")
    # fp16 always: the note's rule, every quantized file is compared against the fp16 one
    return tuple(f for f in known if f in chosen or f == COMPARED_AGAINST)


def _folder_library(spec_path: Path, overrides: list[str]) -> tuple[Any, Any]:
    """(the spec, the library) of a checkpoint folder: the spec's ``model.library`` when its
    checkpoint is a folder of weight formats (``Library.weight_formats``), else the one
    registered library whose checkpoint is; the library is asked, not named."""
    from tasks.libraries import libraries, library_for
    from tasks.runtime.errors import UserError
    from tasks.spec import load_spec

    s = load_spec(spec_path, overrides)
    named = library_for(s)
    if named.weight_formats:
        return s, named
    folders = [lib for lib in libraries() if lib.weight_formats]
    if len(folders) != 1:
        names = ", ".join(lib.name for lib in folders) or "none"
        raise UserError(
            f"a checkpoint folder belongs to one of the libraries with weight formats ({names}); "
            "name it with --set model.library=<library>."
        )
    return load_spec(spec_path, [*overrides, f"model.library={folders[0].name}"]), folders[0]


def _quantize_rt(
    checkpoint: Path,
    fmt: list[str] | None,
    out_dir: Path | None,
    spec_path: Path,
    overrides: list[str],
    rows: int,
    threads: int,
    debug: bool,
) -> None:
    from tasks.runtime.errors import UserError

    target = out_dir or checkpoint.parent
    made: list[Path] = []
    work = Path(tempfile.mkdtemp(prefix="relflow-quantize-"))

    def cleanup() -> None:
        for path in made:
            shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)

    try:
        # before torch is imported: a bad spec or path exits in a second
        s, library = _folder_library(spec_path, overrides)
        formats = _formats(fmt, library.weight_formats)
        if rows < 0 or threads < 1:
            raise UserError("--rows must be 0 or more and --threads at least 1.")
        with interrupted_removes(cleanup):
            F = importlib.import_module(library.formats_module)  # the library's formats (torch: seconds)

            F.checkpoint_dir(checkpoint, "the checkpoint")
            report = _write_and_measure(
                F, checkpoint, s, spec_path.resolve().parent, formats, target, made, work, rows, threads
            )
    except BaseException as err:  # noqa: BLE001
        handle_run_error(err, debug, "the partial format folders were removed.")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out.print(report, markup=False, soft_wrap=True)


def _write_and_measure(
    F: Any,  # the library's formats module (Library.formats_module)
    checkpoint: Path,
    spec: Any,
    spec_dir: Path,
    formats: tuple[str, ...],
    target: Path,
    made: list[Path],
    work: Path,
    rows: int,
    threads: int,
) -> str:
    def folder(fmt: str) -> Path:
        path = target / f"{checkpoint.name.removesuffix('.ckpt')}.{fmt}.ckpt"
        if path.exists():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        made.append(path)
        return path

    target.mkdir(parents=True, exist_ok=True)
    saved = F.write_formats(checkpoint, spec, formats, folder)  # type: ignore[arg-type]
    made.clear()  # written completely: an interrupt from here on keeps them
    ev = F.eval_set(spec, spec_dir, checkpoint, rows) if rows else None
    eval_file = None
    if ev is not None:
        eval_file = work / "eval.pkl"
        eval_file.write_bytes(pickle.dumps(ev, protocol=5))
    probes = {"fp32": F.probe_in_fresh_process(checkpoint, "fp32", spec, eval_file, work, threads)}
    for fmt, ck in saved.items():
        probes[fmt] = F.probe_in_fresh_process(ck.directory, fmt, spec, eval_file, work, threads)
    quality = F.compare(spec.task.kind, probes, ev.labels if ev is not None else None)
    sizes = {"fp32": _weight_bytes(checkpoint), **{f: c.weight_file_bytes for f, c in saved.items()}}
    return _markdown(checkpoint, saved, probes, quality, sizes, len(ev.rows) if ev is not None else 0)


def _weight_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("model.safetensors"))


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _markdown(
    checkpoint: Path,
    saved: dict[str, Any],
    probes: dict[str, Any],
    quality: dict[str, dict[str, float]],
    sizes: dict[str, int],
    eval_rows: int,
) -> str:
    lines = [
        f"source {checkpoint} (fp32); written: " + ", ".join(str(c.directory) for c in saved.values()),
        "",
        "| format | weight file | load s | RSS before load | peak RSS during load | RSS after load "
        "| RSS added by the load | parameters after load |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for fmt, p in probes.items():
        lines.append(
            f"| {fmt} | {sizes[fmt]:,} B | {p.load_seconds:.2f} | {_mib(p.rss_before_load)} "
            f"| {_mib(p.peak_rss_during_load)} | {_mib(p.rss_after_load)} "
            f"| {_mib(p.rss_after_load - p.rss_before_load)} "
            f"| {'/'.join(p.parameter_dtypes)}, {_mib(p.parameter_bytes)} |"
        )
    if quality:
        names = list(next(iter(quality.values())))
        lines += ["", f"Task metrics on {eval_rows} held-out rows, against the fp16 file:", ""]
        lines += ["| format | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        for fmt, row in quality.items():
            lines.append(f"| {fmt} | " + " | ".join(f"{row[n]:.6g}" for n in names) + " |")
    lines += [
        "",
        "Each load ran in a fresh process. The library builds the model in fp32 and copies any file into it:",
        "every format runs as fp32 weights, so a smaller file does not mean a smaller resident set.",
    ]
    return "\n".join(lines)
