"""A file that is not a relflow checkpoint is refused the same way by ``quantize``, ``run``
and ``export`` (issue 24 item 5): exit 2 for quantize as for the others, a reason that says
what is wrong (an empty file's reason was empty), and never torch's advice to load with
``weights_only=False``, which would run whatever code the file holds.

In-process: ``quantize`` through Typer's runner, ``run``'s and ``export``'s loaders directly
(each refuses before it uses the spec).
"""

from __future__ import annotations

import io
import os
import random
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from flows.cli.app import app
from tasks.backends.bundle import export_bundle
from tasks.backends.checkpoint import load_run_checkpoint
from tasks.runtime.errors import UserError
from tasks.spec import parse_spec

SAFETY = "the file is not a relflow checkpoint and is refused for safety"


class _RunsCode:
    """Unpickled, this would call ``os.getcwd``: a global torch's safe loader refuses."""

    def __reduce__(self):
        return (os.getcwd, ())


def _forbidden_global(path: Path) -> None:
    torch.save({"state_dict": _RunsCode()}, path)


def _zip_without_records(path: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", b"junk")
    path.write_bytes(buf.getvalue())


CASES: dict[str, tuple[Callable[[Path], object], str]] = {
    "empty": (lambda p: p.write_bytes(b""), "the file is empty (0 bytes)"),
    "random": (
        lambda p: p.write_bytes(random.Random(24).randbytes(4096)),
        "it is not a relflow checkpoint, or it is truncated (4,096 bytes",
    ),
    "forbidden_global": (_forbidden_global, SAFETY),
    "zip": (_zip_without_records, "it is not a relflow checkpoint, or it is truncated"),
}


@pytest.fixture(params=sorted(CASES))
def bad_checkpoint(request, tmp_path) -> tuple[Path, str]:
    make, reason = CASES[request.param]
    path = tmp_path / f"{request.param}.ckpt"
    make(path)
    return path, reason


def _no_torch_advice(msg: str) -> None:
    assert "weights_only" not in msg and "PyTorch" not in msg and "Traceback" not in msg, msg


def test_quantize_exits_2_with_the_reason_and_leaves_nothing(bad_checkpoint, tmp_path):
    bad, reason = bad_checkpoint
    res = CliRunner().invoke(app, ["quantize", str(bad), "--format", "fp16"])
    msg = " ".join(res.output.split())
    assert res.exit_code == 2, msg
    assert f"checkpoint '{bad}' cannot be quantized: {reason}" in msg
    _no_torch_advice(msg)
    assert [p.name for p in tmp_path.iterdir()] == [bad.name]  # no partial output


def test_run_and_export_give_the_same_reason(bad_checkpoint, shop_spec, tmp_path):
    bad, reason = bad_checkpoint
    spec = parse_spec(shop_spec)
    with pytest.raises(UserError) as run_err:
        load_run_checkpoint(bad, spec)
    with pytest.raises(UserError) as export_err:
        export_bundle(bad, spec, ("prediction",), tmp_path / "bundles")
    assert f"run.checkpoint '{bad}' cannot be loaded: {reason}" in str(run_err.value)
    assert f"checkpoint '{bad}' cannot be loaded: {reason}" in str(export_err.value)
    _no_torch_advice(str(run_err.value) + str(export_err.value))
