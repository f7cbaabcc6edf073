"""Spec keys of request scenarios and database sources: defaults, typos and bad values fail
before any work, naming the key."""

from __future__ import annotations

import pytest

from tasks.runtime.errors import UserError
from tasks.spec import parse_spec


def test_defaults_are_offline_with_loadgen_minimums(shop_spec):
    run = parse_spec(shop_spec).run
    assert run.scenario == "offline"
    assert (run.request.roots, run.request.max_batch, run.request.min_requests) == (1, 1, 1024)
    assert run.request.trace_sample_rate == 0.01


@pytest.mark.parametrize(
    "key, value, needle",
    [
        ("scenario", "stream", "run.scenario"),
        ("request", {"max_batch": 0}, "run.request.max_batch"),
        ("request", {"target_qps": 0}, "run.request.target_qps"),
        ("request", {"roots": 0}, "run.request.roots"),
        ("request", {"latency_bound": 5}, "unknown key 'run.request.latency_bound'"),
        ("request", {"trace_sample_rate": 1.5}, "'run.request.trace_sample_rate': Value error, 1.5 is not a share"),
        ("request", {"trace_sample_rate": -0.1}, "'run.request.trace_sample_rate': Value error, -0.1 is not a share"),
    ],
)
def test_bad_request_settings_name_the_key(shop_spec, key, value, needle):
    shop_spec["run"][key] = value
    with pytest.raises(UserError, match=needle.replace(".", r"\.")):
        parse_spec(shop_spec)


def test_repeats_are_refused_for_request_scenarios(shop_spec):
    shop_spec["run"].update(scenario="server", repeats=3)
    with pytest.raises(UserError, match="run.repeats"):
        parse_spec(shop_spec)


def test_database_source_needs_no_files(shop_spec):
    shop_spec["source"] = {"database": {"url": "duckdb:shop.duckdb"}}
    assert parse_spec(shop_spec).source.database.url == "duckdb:shop.duckdb"
    shop_spec["source"] = {"database": {"url": "postgresql://u@h/db", "password": "x"}}
    with pytest.raises(UserError, match="unknown key 'source.database.password'"):
        parse_spec(shop_spec)
