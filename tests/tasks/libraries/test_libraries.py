"""One tag key per concept across the reference model and the libraries, so a filter in the
MLflow UI finds every library's runs: the serving backend is ``relflow.backend`` for all three
(relational-transformers tagged ``relflow.library_backend``, relflow tagged none), and an ONNX
Runtime run of relational-transformers carries the reference's ONNX Runtime keys
(``relflow.providers``, ``relflow.onnxruntime.intra_op_threads``, ``relflow.onnx_model_file``)
instead of one sentence of its own.

Real engines through the harness's chain on the shop tables (no Prefect); the models are tiny.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import pyarrow as pa
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

LIBRARIES = ("reference", "relflow", "relational_transformers")
# the reference's ONNX Runtime keys (tasks/backends/onnxruntime.py) for what every ONNX run says
ONNX_KEYS = ("relflow.backend", "relflow.providers", "relflow.onnxruntime.intra_op_threads", "relflow.onnx_model_file")


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _spec(shop_spec: dict[str, Any], library: str, **run: Any) -> dict[str, Any]:
    spec = copy.deepcopy(shop_spec)
    # two blocks: relational-transformers refuses the lines branch with one
    spec["model"] = {"library": library, "d_model": 8, "layers": 2, "heads": 2}
    spec["run"] |= {"system_metrics_interval_s": 0, "batch_size": 2, **run}
    spec["task"]["validation_fraction"] = 0.4  # customers 1 and 4 held out: both sides have rows
    return spec


@pytest.fixture
def shop_two_classes(shop_tables, write_tables) -> Any:
    """The shop as Parquet with customer 2 churning too: the training split (customers 2, 3
    and 5 at validation_fraction 0.4) holds both classes."""
    c = shop_tables["customers"]
    churn = pa.array(["yes", "yes", "no", "yes", "no"])
    return write_tables(dict(shop_tables, customers=c.set_column(c.schema.get_field_index("churn"), "churn", churn)))


def _run_tags(spec_dict: dict[str, Any], folder: Any) -> dict[str, str]:
    """The tags a run logs about what served it: the engine's backend tags (run_log) and the
    model's facts (assemble), after one predict pass over every shop customer."""
    from tasks.run.chain import Chain
    from tasks.sources.files import resolve_sources
    from tasks.spec import parse_spec
    from tasks.stages.retrieve import list_root_keys

    spec = parse_spec(spec_dict)
    chain = Chain(spec, resolve_sources(spec, folder), torch.device("cpu"))
    keys, _ = list_root_keys(spec, chain.sources)
    tz = chain.prepare_untimed(keys)
    engine = chain.ensure_engine()
    assert engine is not None
    engine.predict(tz, ("prediction",))
    tags = {**engine.backend_tags(), **engine.facts().tags}
    engine.close()
    return tags


@pytest.mark.parametrize("library", LIBRARIES)
def test_every_library_tags_its_serving_backend_under_one_key(library, shop_spec, shop_two_classes) -> None:
    tags = _run_tags(_spec(shop_spec, library), shop_two_classes)
    assert tags["relflow.backend"] == "pytorch"
    assert not {k for k in tags if k.endswith("_backend")}  # relflow.library_backend, before


def test_an_onnx_runtime_run_of_relational_transformers_has_the_references_onnx_keys(
    shop_spec, shop_two_classes
) -> None:
    tags = _run_tags(_spec(shop_spec, "relational_transformers", backend="onnxruntime"), shop_two_classes)
    assert {k: tags[k] for k in ONNX_KEYS if k in tags} == {
        "relflow.backend": "onnxruntime",
        "relflow.providers": "CPUExecutionProvider",  # what the session runs on
        "relflow.onnxruntime.intra_op_threads": "1",  # run.onnxruntime.intra_op_threads 0: torch's
        "relflow.onnx_model_file": "model.onnx",
    }
    assert tags["relflow.library_onnx"] == "exported by the library"  # the library's own: where from
