"""The registry of libraries (tasks/libraries/__init__.py ``LIBRARIES``): one line per library,
each imported only when named, and what the harness asks each one instead of testing its name."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tasks.libraries import LIBRARIES, check_library, libraries, library_named, library_packages
from tasks.runtime.errors import UserError
from tasks.spec import load_spec
from tests.repo import REPO

DEFAULT = REPO / "benchmarks" / "tpch_orders.yaml"


def test_each_line_names_a_library_of_that_name_with_every_member_the_harness_asks():
    for name in LIBRARIES:
        lib = library_named(name)
        assert lib.name == name
        assert isinstance(lib.packages, tuple) and isinstance(lib.weight_formats, tuple)
        assert isinstance(lib.model_floors, bool) and isinstance(lib.own_checkpoint, bool)
        assert (lib.formats_module is None) == (not lib.weight_formats)
    assert [lib.name for lib in libraries()] == list(LIBRARIES)


def test_an_unknown_name_is_a_user_error_listing_every_registered_library():
    spec = load_spec(DEFAULT, ["model.library=lightgmb"])  # the spec holds any name: the registry decides
    with pytest.raises(UserError) as err:
        check_library(spec)
    assert err.value.exit_code == 2
    assert "model.library 'lightgmb' is not a registered library" in str(err.value)
    assert "choose from reference, relflow, relational_transformers, lightgbm" in str(err.value)


def test_the_cli_exits_2_on_an_unknown_library_before_any_work(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli.app", "run", str(DEFAULT), "--set", "model.library=bogus"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    out = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, out
    assert "'bogus' is not a registered library; choose from reference, relflow, relational_transformers" in out
    assert not (tmp_path / "data").exists()


def test_naming_a_library_imports_neither_another_library_nor_its_package():
    probe = (
        "import sys; from tasks.libraries import library_named, library_packages\n"
        "library_named('relational_transformers'); library_named('lightgbm'); library_packages()\n"
        "print(sorted(m for m in ('relflow', 'lightning', 'lightgbm', 'relational_transformers', 'torch') "
        "if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.stdout.split() == ["[]"], done.stdout + done.stderr


def test_the_fingerprint_tags_every_registered_librarys_packages():
    assert library_packages() == ["relflow", "lightning", "relational-transformers", "lightgbm"]
    import torch

    from tasks.measure.environment import fingerprint

    tags = fingerprint(torch.device("cpu"), library_packages())
    assert tags["relflow.relflow_version"] == "0.4.0" and tags["relflow.lightgbm_version"] == "4.7.0"
    assert tags["relflow.relational_transformers_version"] == "0.1.0"
    assert "relflow.polars_version" in tags and "relflow.relflow_version" not in fingerprint(torch.device("cpu"))
