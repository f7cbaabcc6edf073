"""``relflow-bench export``, ``quantize``, ``backends-report`` and ``models-report``: the deployment commands.

Registered on the main Typer app in ``flows/cli/__init__.py``; exit codes as every command's (see
``flows/cli/common.py``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated, Any

import typer

from flows.cli.common import DEFAULT_SPEC, console, handle_run_error, interrupted_removes, out, start_run_command


def export_cmd(
    spec: Annotated[Path, typer.Argument(help="The benchmark spec the checkpoint was trained with.")],
    checkpoint: Annotated[Path, typer.Option("--checkpoint", help="Checkpoint to export (any weight format).")],
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Folder for the bundle (default: <run.output_dir>/bundles).")
    ] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Spec override, as for run.")] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks.")] = False,
) -> None:
    """Export a checkpoint to ONNX (dynamic batch and cell axes) as a content-hashed bundle."""
    from tasks.spec import load_spec

    try:
        s = load_spec(spec, list(set_ or []))  # before torch is imported: a bad spec exits in a second
        folder = out_dir or Path(s.run.output_dir) / "bundles"
        with interrupted_removes(lambda: _remove_export_temps(folder, s.name)):
            from tasks.backends.bundle import export_bundle
            from tasks.run.backend_setup import needed_outputs

            bundle = export_bundle(checkpoint, s, needed_outputs(s), folder)
    except BaseException as err:  # noqa: BLE001
        handle_run_error(err, debug, "the temporary bundle folder was removed.")
    m = bundle.manifest
    out.print(
        f"bundle      {bundle.path}\n"
        f"model.onnx  {m['model_bytes']:,} bytes, opset {m['opset']}, outputs {list(bundle.outputs)}\n"
        f"checkpoint  sha256 {m['checkpoint_sha256'][:16]}... ({m['checkpoint_weights_format']})\n"
        f"export      {m['export_seconds']:.1f} s with torch {m['torch_version']}, onnx {m['onnx_version']}"
    )


def quantize_cmd(
    checkpoint: Annotated[Path, typer.Argument(help="An fp32 checkpoint (a train+predict run's .ckpt).")],
    fmt: Annotated[str, typer.Option("--format", help="fp16 | int8 | int4 | fp8")],
    out_file: Annotated[
        Path | None, typer.Option("--out", help="Output file (default: beside the checkpoint, <name>.<format>.ckpt).")
    ] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks.")] = False,
) -> None:
    """Write a checkpoint in a quantized weight format (records the format and source hash)."""
    from tasks.runtime.errors import UserError

    try:
        from model.quantize import FORMATS

        if fmt not in FORMATS:
            raise UserError(f"--format '{fmt}' is not one of {', '.join(FORMATS)}.")
        if not checkpoint.is_file():
            raise UserError(f"checkpoint '{checkpoint}' does not exist; pass the .ckpt a train+predict run wrote.")
        target = out_file or checkpoint.with_suffix(f".{fmt}.ckpt")
        tmp = target.with_name(f".{target.name}.tmp")
        with interrupted_removes(lambda: tmp.unlink(missing_ok=True)):
            info = _quantize(checkpoint, tmp, fmt)
            tmp.replace(target)
    except BaseException as err:  # noqa: BLE001
        handle_run_error(err, debug, "the partial output file was removed.")
    src = checkpoint.stat().st_size
    out.print(
        f"{target}: {fmt}, {info['bytes']:,} bytes ({info['bytes'] / src:.2f}x the source's "
        f"{src:,}), source sha256 {info['source_sha256'][:16]}..."
    )


def _quantize(checkpoint: Path, tmp: Path, fmt: str) -> dict[str, Any]:
    """``model.checkpoint.quantize_checkpoint`` with a bad source as a ``UserError`` (exit 2, as
    ``run`` and ``export`` refuse it; the caller removes the partial file)."""
    from model.checkpoint import quantize_checkpoint
    from tasks.backends.checkpoint import load_error_reason
    from tasks.runtime.errors import UserError
    from tasks.runtime.writes import named_write_errors

    try:
        with named_write_errors(tmp, "the quantized checkpoint", "--out"):
            return quantize_checkpoint(checkpoint, tmp, fmt)
    except (UserError, OSError):
        raise
    except Exception as err:  # noqa: BLE001 - any unreadable source is the same user problem
        raise UserError(
            f"checkpoint '{checkpoint}' cannot be quantized: {load_error_reason(checkpoint, err)}. "
            "Pass an fp32 .ckpt a train+predict run wrote."
        ) from None


def _remove_export_temps(folder: Path, name: str) -> None:
    from tasks.backends.bundle import temp_prefix

    for tmp in folder.glob(f"{temp_prefix(name)}*"):
        shutil.rmtree(tmp, ignore_errors=True)


def backends_report_cmd(
    spec: Annotated[Path, typer.Argument(help="Benchmark spec YAML.")] = DEFAULT_SPEC,
    repeats: Annotated[int, typer.Option(help="Interleaved rounds (each runs every variant).")] = 2,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Spec override, as for run.")] = None,
    scale: Annotated[float | None, typer.Option(help="TPC-H scale factor.")] = None,
    variant: Annotated[list[str] | None, typer.Option(help="Only these variants (repeatable).")] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks.")] = False,
) -> None:
    """Train once, then every backend / weight-format variant in fresh processes, interleaved."""
    from tasks.runtime.errors import UserError
    from tasks.spec import load_spec

    # SIGTERM unwinds like Ctrl-C: the running variant is stopped (its run ends KILLED) and
    # the parent run is ended too, never left RUNNING.
    overrides = start_run_command(debug, set_, scale)
    try:
        load_spec(spec, overrides)  # before MLflow and the report's imports (10+ s): a bad spec exits in a second
        from flows.sweeps.backends_report import VARIANTS, run_report

        unknown = [v for v in variant or [] if v not in VARIANTS]
        if unknown:
            raise UserError(f"--variant {unknown} unknown; choose from {list(VARIANTS)}.")
        md = run_report(
            spec.resolve(),
            overrides,
            repeats,
            list(variant or VARIANTS),
            lambda line: console.print(line, markup=False, soft_wrap=True),
        )
    except BaseException as err:  # noqa: BLE001
        handle_run_error(err, debug, "the running variant and the report's parent MLflow run were ended.")
    out.print(md, markup=False, soft_wrap=True)  # "[n=1<6, no CI]" is text, not Rich markup


def models_report_cmd(
    spec: Annotated[Path, typer.Argument(help="Benchmark spec YAML.")] = DEFAULT_SPEC,
    rounds: Annotated[int, typer.Option(help="Interleaved rounds (each runs every library).")] = 2,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Spec override for every library, as for run.")
    ] = None,
    libraries: Annotated[
        str | None,
        typer.Option(help="Comma-separated libraries (default: every registered one, tasks/libraries LIBRARIES)."),
    ] = None,
    library_set: Annotated[
        list[str] | None,
        typer.Option(
            "--library-set",
            help="Spec override for one library only, LIB:KEY=VALUE, after --set (e.g. lightgbm:run.repeats=16).",
        ),
    ] = None,
    include_busy_host: Annotated[
        bool,
        typer.Option(
            "--include-busy-host",
            help="Also take the figures of rounds INVALID only for the host's load (noted; never for claims).",
        ),
    ] = False,
    scale: Annotated[float | None, typer.Option(help="TPC-H scale factor.")] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks.")] = False,
) -> None:
    """The libraries (model.library) on one spec and data, in fresh processes, interleaved."""
    from tasks.runtime.errors import UserError
    from tasks.spec import load_spec

    overrides = start_run_command(debug, set_, scale)
    try:
        if rounds < 1:
            raise UserError("--rounds must be at least 1.")
        from flows.sweeps.models_report import parse_libraries, parse_library_sets

        try:
            chosen = parse_libraries(libraries)
            own = parse_library_sets(library_set, chosen)
        except ValueError as err:
            raise UserError(str(err)) from None
        load_spec(spec, overrides)  # before MLflow and the report's imports: a bad spec exits in a second
        for lib, sets in own.items():
            load_spec(spec, [*overrides, *sets, f"model.library={lib}"])  # a library's own bad key, as fast
        from flows.sweeps.models_report import run_report

        md = run_report(
            spec.resolve(),
            overrides,
            rounds,
            chosen,
            lambda line: console.print(line, markup=False, soft_wrap=True),
            own,
            include_busy_host,
        )
    except BaseException as err:  # noqa: BLE001
        handle_run_error(err, debug, "the running library's run and the report's parent MLflow run were ended.")
    out.print(md, markup=False, soft_wrap=True)
