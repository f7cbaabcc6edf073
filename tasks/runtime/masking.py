"""Secrets never leave the process: every URI shown, logged or stored is masked here.

``mask_uri`` is the one URI masker: for any scheme, in any letter case (``HTTP://``,
``Postgresql://``), the userinfo is masked: whole (``https://***@host``: there a user part
alone is often a token) except on database schemes, where only the password goes
(``postgresql://bench:***@host``: the login name helps and is no secret), and the value of
every secret-looking query parameter (``token``, ``password``, ``secret``, ``api_key``,
``signature``, ...) becomes ``***``. ``mask_secrets`` applies it to every URI in a text
(error messages, params, tags) and masks ``password=...`` key/value connection strings.
Only ``tasks.sources.databases`` and the MLflow client ever see a real URI.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit

MASK = "***"
# A query parameter whose name contains one of these carries a secret (api_key, access_token, ...).
SECRET_QUERY_WORDS = ("password", "passwd", "pwd", "token", "secret", "key", "auth", "credential", "signature", "sig")
# Schemes whose user-only userinfo is a login name, not a token.
DATABASE_SCHEMES = ("postgresql", "postgres", "mysql", "mssql", "oracle", "duckdb", "sqlite")

_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
_KV_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?P<pw>[^\s&;'\"]+)", re.IGNORECASE)
_ENV_REFERENCE = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}")


def _secret_key(name: str) -> bool:
    return any(word in name.lower() for word in SECRET_QUERY_WORDS)


def _split_userinfo(uri: str) -> tuple[str, str, str | None, str] | None:
    """(``scheme://``, user, password or None, rest from ``@`` on) or None without userinfo.

    Parsed by hand rather than by ``urlsplit``'s netloc, which raises on a password holding
    ``[`` or a bad port: a masker must never fail on the text it is hiding."""
    head, sep, tail = uri.partition("://")
    if not sep:
        return None
    authority_end = min((i for i in (tail.find("/"), tail.find("?"), tail.find("#")) if i >= 0), default=len(tail))
    at = tail.rfind("@", 0, authority_end)
    if at < 0:
        return None
    user, colon, password = tail[:at].partition(":")
    return head + "://", user, password if colon else None, tail[at:]


def mask_uri(uri: str) -> str:
    """``uri`` with its userinfo secret and secret-looking query values replaced by ``***``."""
    out = uri
    parts = _split_userinfo(out)
    if parts is not None:
        head, user, password, rest = parts
        scheme = head[:-3].split("+", 1)[0].lower()
        if scheme not in DATABASE_SCHEMES:
            out = f"{head}{MASK}{rest}"
        elif password:
            out = f"{head}{user}:{MASK}{rest}"
    if "?" in out:
        base, _, query_and_fragment = out.partition("?")
        query, hash_, fragment = query_and_fragment.partition("#")
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_secret_key(k) for k, _ in pairs):
            query = urlencode([(k, MASK if _secret_key(k) else v) for k, v in pairs], safe="*/:,")
            out = f"{base}?{query}{hash_}{fragment}"
    return out


def mask_secrets(text: str) -> str:
    """``text`` with every URI masked (``mask_uri``) and every ``password=`` value replaced by ``***``."""
    text = _URI.sub(lambda m: mask_uri(m[0]), text)
    return _KV_PASSWORD.sub(lambda m: m["head"] + MASK, text)


def literal_password(url: str) -> bool:
    """True when ``url`` spells a secret itself: a userinfo password or a secret-looking query
    value (``${VAR}``, read from the environment, is fine)."""
    parts = _split_userinfo(url)
    if parts is not None and parts[2] and not _ENV_REFERENCE.fullmatch(parts[2]):
        return True
    query = url.partition("?")[2].partition("#")[0]
    return any(_secret_key(k) and v and not _ENV_REFERENCE.fullmatch(v) for k, v in parse_qsl(query))


def has_userinfo(uri: str) -> bool:
    """Whether ``uri`` carries ``user[:password]@`` before its host, whatever the scheme's case."""
    return _split_userinfo(uri) is not None


def scheme_of(uri: str) -> str:
    """The URI's scheme in lower case without a driver (``Postgresql+psycopg`` -> ``postgresql``)."""
    try:
        return urlsplit(uri).scheme.split("+", 1)[0].lower()
    except ValueError:
        return uri.partition("://")[0].split("+", 1)[0].lower()
