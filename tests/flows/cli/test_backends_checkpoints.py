"""``relflow-bench quantize`` and ``export`` under signals and bad checkpoints (issue 24).

SIGTERM while either writes: exit 130 and its temporary file or folder removed, as ``run``
ends (tasks/runtime/interrupts.py); before, quantize left a ``.<name>.ckpt.tmp`` and both
died by the signal (143). A bad checkpoint is exit 2 for quantize as for run and export,
with a reason that is not empty and does not suggest ``weights_only=False`` (quantize's and the
loaders' reasons in-process: tests/tasks/backends/test_checkpoint_refusals.py; here export's
exit through the real process).

Named ``test_backends_checkpoints.py`` (tests/README.md): test_backends.py is tasks/backends'
(pytest needs unique basenames); flows/cli/backends.py holds the export and quantize commands.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from cli_signals import terminate_when

pytestmark = pytest.mark.slow  # each test starts the CLI in a subprocess (torch import, a 200 MB checkpoint)


def _checkpoint(shop_spec, shop_files, prepare_chunk, folder: Path, **model: int) -> tuple[Path, Path]:
    """A run checkpoint of the shop workload (untrained weights: only its size matters here)
    and the predict-mode spec it matches."""
    from tasks.backends.checkpoint import save_run_checkpoint
    from tasks.libraries.reference.engine import Engine

    spec, enc, schema, _ = prepare_chunk({**shop_spec, "model": {**shop_spec.get("model", {}), **model}}, shop_files)
    engine = Engine(spec, schema, torch.device("cpu"), encoding=enc)
    path = folder / "shop.ckpt"
    save_run_checkpoint(path, engine, enc, spec)
    raw = spec.to_dict()
    raw["run"]["mode"] = "predict"
    spec_file = folder / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path, spec_file


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_sigterm_during_quantize_exits_130_and_removes_the_partial_file(shop_spec, shop_files, prepare_chunk, tmp_path):
    # d_model 1024: a ~200 MB fp32 checkpoint, so the fp16 file takes a while to write
    ckpt, _ = _checkpoint(shop_spec, shop_files, prepare_chunk, tmp_path, d_model=1024, layers=4, heads=4)
    target = tmp_path / "shop.fp16.ckpt"
    tmp = tmp_path / ".shop.fp16.ckpt.tmp"
    code, err, seconds, alive = terminate_when(
        ["quantize", str(ckpt), "--format", "fp16"], tmp_path, lambda pid: tmp.exists(), {}
    )
    assert code == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    assert not tmp.exists() and not target.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".shop")) == []
    assert not alive and seconds < 10


def test_sigterm_during_export_exits_130_and_removes_the_temporary_bundle(
    shop_spec, shop_files, prepare_chunk, tmp_path
):
    ckpt, spec_file = _checkpoint(shop_spec, shop_files, prepare_chunk, tmp_path)
    out = tmp_path / "bundles"

    def exporting(pid: int) -> bool:
        return out.is_dir() and any(p.name.startswith(f".{shop_spec['name']}-export-") for p in out.iterdir())

    code, err, seconds, alive = terminate_when(
        ["export", str(spec_file), "--checkpoint", str(ckpt), "--out", str(out)], tmp_path, exporting, {}
    )
    assert code == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    assert list(out.iterdir()) == []  # neither the temporary folder nor a bundle
    assert not alive and seconds < 10


def _pickle_of_objects(path: Path) -> None:
    class Payload:
        def __reduce__(self):
            return (os.getcwd, ())

    torch.save({"x": Payload()}, path)


def test_export_names_a_pickle_as_not_a_relflow_checkpoint(shop_spec, shop_files, prepare_chunk, tmp_path):
    _, spec_file = _checkpoint(shop_spec, shop_files, prepare_chunk, tmp_path)
    bad = tmp_path / "evil.ckpt"
    _pickle_of_objects(bad)
    r = _cli(["export", str(spec_file), "--checkpoint", str(bad), "--out", str(tmp_path / "b")], tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    msg = " ".join(r.stderr.split())
    assert "not a relflow checkpoint" in msg and "refused for safety" in msg and "weights_only" not in msg
