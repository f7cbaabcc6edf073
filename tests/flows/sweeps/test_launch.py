"""The pieces of a sweep's per-configuration process launch that need no process."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from flows.sweeps.grid import expand
from flows.sweeps.launch import REPO, child_env, child_error, run_command
from tasks.spec import load_spec, parse_spec

SPEC = Path(__file__).resolve().parents[3] / "benchmarks" / "tpch_orders.yaml"


def test_a_configuration_written_as_yaml_keeps_its_spec_hash():
    """Resuming finds a configuration's child by spec hash: the child must log the same one."""
    base = load_spec(SPEC, ["run.learning_rate=0.0003", "lineitem.max_length=4"])
    configs = expand(
        base, {"run.batch_size": [64, 256], "run.packing": ["auto", "off"], "run.compile.encoders": [False, True]}
    )
    for c in configs:
        again = parse_spec(yaml.safe_load(yaml.safe_dump(c.spec, sort_keys=False)))
        assert again.spec_hash == c.spec_hash


def test_command_is_a_standalone_run_with_parent_and_tags(tmp_path):
    cmd = run_command(
        tmp_path / "c.yaml",
        "/data/specs",
        "abc123",
        {"relflow.sweep.run.packing": "off", "k": "a=b"},
        tmp_path / "c.json",
    )
    assert cmd[1:4] == ["-m", "flows.cli", "run"]
    assert cmd[cmd.index("--spec-dir") + 1] == "/data/specs"
    assert cmd[cmd.index("--parent-run") + 1] == "abc123"
    assert "relflow.sweep.run.packing=off" in cmd and "k=a=b" in cmd


def test_child_env_points_at_the_sweeps_store_server_and_code(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = child_env("sqlite:////x/mlflow.db", "http://127.0.0.1:4200/api")
    assert env["MLFLOW_TRACKING_URI"] == "sqlite:////x/mlflow.db"
    assert env["PREFECT_API_URL"] == "http://127.0.0.1:4200/api"
    assert env["PYTHONPATH"].split(":")[0] == str(REPO)


def test_child_error_is_the_closing_paragraph_on_one_line():
    log = "progress...\nerror: Table 'orders' (/d/orders.csv), column\n'x': bad value '?'.\n"
    assert child_error(log, 2) == "UserError: Table 'orders' (/d/orders.csv), column 'x': bad value '?'."
    log = "failed: ValueError: boom\n(rerun with --debug for the traceback)\n"
    assert child_error(log, 1) == "ValueError: boom"
    assert child_error("Segmentation fault\n", -11).startswith("exit code -11: Segmentation fault")


def test_each_child_compiles_in_empty_compiler_caches_removed_after_it(tmp_path, monkeypatch):
    """A child sees only its own compiler cache folders (the user's default is shared by every
    run: an earlier configuration's compiles made a later one's first call 5x faster), and they
    are gone once it ends. The child here is a stand-in that reports what it was given."""
    from flows.sweeps import launch

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/shared-by-everyone")
    seen = tmp_path / "seen.txt"

    def command(spec_file, spec_dir, parent_run_id, tags, json_out):
        script = (
            "import os, pathlib; d = os.environ['TORCHINDUCTOR_CACHE_DIR']; os.makedirs(d); "
            "pathlib.Path(d, 'graph').write_text('x'); "
            f"pathlib.Path({str(seen)!r}).write_text(d + '\\n' + os.environ['TRITON_CACHE_DIR'])"
        )
        return [sys.executable, "-c", script]

    monkeypatch.setattr(launch, "run_command", command)
    out = launch.launch_local(
        {"name": "x"},
        name="config-0",
        spec_dir=str(tmp_path),
        parent_run_id="p",
        tags={},
        workdir=tmp_path,
        tracking_uri="sqlite:////x/mlflow.db",
        api_url=None,
    )
    inductor, triton = seen.read_text().splitlines()
    assert out.returncode == 0
    assert Path(inductor) == tmp_path / "config-0.compiler-cache" / "inductor"
    assert Path(triton) == tmp_path / "config-0.compiler-cache" / "triton"
    assert not (tmp_path / "config-0.compiler-cache").exists()  # the compiled graph went with it


def test_compiler_cache_state_names_where_a_runs_graphs_came_from():
    from tasks.run.record.collect import compiler_cache_state

    assert compiler_cache_state(0, 0) == "none"
    assert compiler_cache_state(0, 3) == "cold"
    assert compiler_cache_state(3, 0) == "warm"
    assert compiler_cache_state(1, 2) == "mixed"
