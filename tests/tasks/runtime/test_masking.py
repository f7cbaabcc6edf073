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
        ("http://u:p@ss@h/x", "http://***@h/x"),  # an unencoded @ in the password
        ("POSTGRES+asyncpg://u:s3cret@db/x", "POSTGRES+asyncpg://u:***@db/x"),
        ("MySQL://u:s3cret@db/x", "MySQL://u:***@db/x"),
        # Only the secret values change; the rest (%2F, order, other values) stays as written.
        (
            "https://s3.example/b/o?X-Amz-Credential=AK%2F1&X-Amz-Signature=s3cret&x=%2F",
            "https://s3.example/b/o?X-Amz-Credential=***&X-Amz-Signature=***&x=%2F",
        ),
        ("http://h/?a=1;token=s3cret", "http://h/?a=1;token=***"),  # ';' separates parameters too
        ("https://h/cb#access_token=s3cret&state=1", "https://h/cb#access_token=***&state=1"),  # OAuth fragment
        ("http://h/?client_secret=s3cret&passphrase=s3cret", "http://h/?client_secret=***&passphrase=***"),
        ("http://h:5000/#/experiments/1/runs/abc", "http://h:5000/#/experiments/1/runs/abc"),  # a UI link
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
    assert literal_password("postgresql://u@h/db?sslmode=require;password=pw")


def test_mask_secrets_masks_secret_key_values_in_free_text_but_not_settings():
    out = mask_secrets("PGPASSWORD=s3cret api_token=s3cret; run.max_tokens=64 schema.root.key=c_id")
    assert "s3cret" not in out and "PGPASSWORD=***" in out and "api_token=***" in out
    assert "run.max_tokens=64" in out and "schema.root.key=c_id" in out  # messages quote settings


def test_log_lines_and_their_tracebacks_show_uris_masked():
    import io
    import logging

    from tasks.runtime.masking import mask_log_secrets

    stream = io.StringIO()
    logger = logging.getLogger("relflow.test_masking")
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        mask_log_secrets()
        mask_log_secrets()  # idempotent: one filter per handler
        assert len(handler.filters) == 1
        logger.warning("store %s unreachable", "HTTP://alice:s3cret@h/?token=s3cret")
        try:
            raise ConnectionError("postgresql://bob:s3cret@db/mlflow refused")
        except ConnectionError:
            logger.exception("giving up on %s", "https://h/?api_key=s3cret")
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert "s3cret" not in text
    assert "HTTP://***@h/?token=***" in text and "postgresql://bob:***@db/mlflow refused" in text
    assert "ConnectionError" in text and "api_key=***" in text  # the traceback is kept, masked


def test_there_is_one_uri_masker():
    import tasks.run.checks.preflight as preflight
    import tasks.tracking.datasets as datasets

    assert not hasattr(datasets, "redact_url")
    assert preflight.mask_uri is mask_uri
