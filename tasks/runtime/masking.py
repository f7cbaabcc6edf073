"""Secrets never leave the process: every URI shown, logged or stored is masked here.

``mask_uri`` is the one URI masker: for any scheme, in any letter case (``HTTP://``,
``Postgresql://``), the userinfo is masked: whole (``https://***@host``: there a user part
alone is often a token) except on database schemes, where only the password goes
(``postgresql://bench:***@host``: the login name helps and is no secret), and the value of
every secret-looking query or fragment parameter (``token``, ``password``, ``secret``,
``api_key``, ``signature``, ..., ``&`` or ``;`` separated; ``#access_token=`` as OAuth
returns it) becomes ``***``. ``mask_secrets`` applies it to every URI in a text (error
messages, params, tags, tracebacks) and masks ``password=...``-like key/value pairs
(``PGPASSWORD=``, ``client_secret=``, ``api_token=``). ``SecretsLogFilter`` does the same to
log records. Only ``tasks.sources.databases`` and the MLflow client ever see a real URI.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_plus, urlsplit

MASK = "***"
# A query parameter whose name contains one of these carries a secret (api_key, access_token, ...).
SECRET_QUERY_WORDS = (
    "password", "passwd", "pwd", "passphrase", "token", "secret", "key", "auth", "credential", "signature", "sig",
)  # fmt: skip
# Schemes whose user-only userinfo is a login name, not a token.
DATABASE_SCHEMES = ("postgresql", "postgres", "mysql", "mssql", "oracle", "duckdb", "sqlite")

_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
# In free text only unmistakable names: "key=" or "max_tokens=" there are spec settings.
_KV_PASSWORD = re.compile(
    r"(?P<head>\b(?:\w*(?:password|passwd|pwd|passphrase|secret)\w*|(?:\w+_)?token)\s*=\s*)(?P<pw>[^\s&;'\"]+)",
    re.IGNORECASE,
)
# One ``name=value`` of a query or fragment, ``&`` or ``;`` separated; the value kept raw.
_PARAM = re.compile(r"(?P<name>[^&;=#]+)=(?P<value>[^&;#]*)")
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
    """``uri`` with its userinfo secret and secret-looking query and fragment values replaced by ``***``."""
    out = uri
    parts = _split_userinfo(out)
    if parts is not None:
        head, user, password, rest = parts
        scheme = head[:-3].split("+", 1)[0].lower()
        if scheme not in DATABASE_SCHEMES:
            out = f"{head}{MASK}{rest}"
        elif password:
            out = f"{head}{user}:{MASK}{rest}"
    base, hash_, fragment = out.partition("#")
    base, qmark, query = base.partition("?")
    # Edited in place, not parsed and re-encoded: the rest of the URI stays as it was written.
    return base + qmark + _mask_params(query) + hash_ + _mask_params(fragment)


def _mask_params(params: str) -> str:
    def one(m: re.Match[str]) -> str:
        return f"{m['name']}={MASK}" if _secret_key(unquote_plus(m["name"])) else m[0]

    return _PARAM.sub(one, params)


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
    query = url.partition("#")[0].partition("?")[2]
    return any(
        _secret_key(unquote_plus(m["name"])) and m["value"] and not _ENV_REFERENCE.fullmatch(unquote_plus(m["value"]))
        for m in _PARAM.finditer(query)
    )


def has_userinfo(uri: str) -> bool:
    """Whether ``uri`` carries ``user[:password]@`` before its host, whatever the scheme's case."""
    return _split_userinfo(uri) is not None


def scheme_of(uri: str) -> str:
    """The URI's scheme in lower case without a driver (``Postgresql+psycopg`` -> ``postgresql``)."""
    try:
        return urlsplit(uri).scheme.split("+", 1)[0].lower()
    except ValueError:
        return uri.partition("://")[0].split("+", 1)[0].lower()


class SecretsLogFilter(logging.Filter):
    """Masks a log record's message and traceback (``mask_secrets``): a library's log line or
    exception text holding a URI shows it masked. Added to handlers, which every record
    reaches whatever logger it was logged on."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_secrets(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = mask_secrets(record.exc_text)
        return True


def mask_log_secrets() -> None:
    """Add ``SecretsLogFilter`` to every handler configured now (the root logger's and each
    named logger's: Prefect's and MLflow's configure theirs on import, so call after those)."""
    loggers = [logging.getLogger()] + [
        lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    for logger in loggers:
        for handler in logger.handlers:
            if not any(isinstance(f, SecretsLogFilter) for f in handler.filters):
                handler.addFilter(SecretsLogFilter())
