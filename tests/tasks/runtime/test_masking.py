"""The one URI masker (tasks/runtime/masking.py, issue 24): any scheme case, userinfo and
secret-looking query values, in URIs and in free text."""

from __future__ import annotations

import pytest

from tasks.runtime.masking import has_userinfo, literal_password, mask_secrets, mask_uri


@pytest.mark.parametrize(
    ("uri", "masked"),
    [
        ("http://alice:s3cret@host:5000/x", "http://***@host:5000/x"),
        ("HTTP://alice:s3cret@host:5000/x", "HTTP://***@host:5000/x"),
        ("Https://TOKEN123@host/", "Https://***@host/"),
        ("http://host/?token=s3cret&x=1", "http://host/?token=***&x=1"),
        ("http://host/api?API_KEY=s3cret#top", "http://host/api?API_KEY=***#top"),
        ("Postgresql://bench:s3cret@db:5432/m?sslmode=require", "Postgresql://bench:***@db:5432/m?sslmode=require"),
        ("postgresql+psycopg://u:p@db/mlflow?password=s3cret", "postgresql+psycopg://u:***@db/mlflow?password=***"),
        ("postgresql://bench@db/tpch", "postgresql://bench@db/tpch"),  # a login name is no secret
        ("sqlite:////tmp/a.db", "sqlite:////tmp/a.db"),
        ("http://u:p[w@h/", "http://***@h/"),  # unparseable by urlsplit: still masked
    ],
)
def test_mask_uri(uri, masked):
    assert mask_uri(uri) == masked


def test_mask_secrets_masks_every_uri_in_a_text():
    text = "refused 'HTTP://a:s3cret@h:1/x?Token=s3cret' then postgresql://b:s3cret@d/x; password=s3cret"
    out = mask_secrets(text)
    assert "s3cret" not in out
    assert "HTTP://***@h:1/x?Token=***" in out and "postgresql://b:***@d/x;" in out and "password=***" in out


def test_literal_password_sees_query_secrets_and_allows_environment_references():
    assert literal_password("Postgresql://u:pw@h/db")
    assert literal_password("postgresql://u@h/db?password=pw")
    assert not literal_password("postgresql://u:${PGPW}@h/db?password=${PGPW}")
    assert not literal_password("postgresql://u@h/db?sslmode=require")
    assert has_userinfo("HTTP://u@h") and not has_userinfo("http://h/a@b")


def test_there_is_one_uri_masker():
    import tasks.checks.preflight as preflight
    import tasks.tracking.datasets as datasets

    assert not hasattr(datasets, "redact_url")
    assert preflight.mask_uri is mask_uri
