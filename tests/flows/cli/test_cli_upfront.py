"""Every command that reads a spec checks it before importing torch, Prefect or MLflow
(issue 24 item 7: bad input exited after 10-15 s of imports; ``floors`` took 23 s,
``serve`` 14 s and ``backends-report`` 9 s to say "unknown key"). What was imported is
read from ``-X importtime``, not from the clock: the host's load moves the time.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

HEAVY = {"torch", "prefect", "mlflow"}

COMMANDS = {
    "run": [],
    "compile-report": [],
    "noise": [],
    "floors": [],
    "peak-qps": ["--bound-ms", "5"],
    "sweep": [],
    "budget": [],
    "export": ["--checkpoint", "CKPT"],
    "backends-report": [],
    "serve": [],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_bad_spec_exits_2_before_the_heavy_imports(command, tmp_path, shop_spec):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(dict(shop_spec, bogus=1)))
    (tmp_path / "x.ckpt").write_bytes(b"")
    args = [str(tmp_path / "x.ckpt") if a == "CKPT" else a for a in COMMANDS[command]]
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", command, str(spec), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = proc.stderr.splitlines()
    message = " ".join(line for line in lines if not line.startswith("import time:"))
    assert proc.returncode == 2, message[-2000:]
    assert "unknown key 'bogus'" in message, message[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in lines if line.startswith("import time:")}
    assert imported, "no -X importtime output"
    assert not imported & HEAVY, sorted(imported & HEAVY)
    assert not (tmp_path / "m.db").exists()
