"""Database passwords never leave the process: every URL shown or logged is masked.

``mask_secrets`` rewrites ``scheme://user:password@host`` to ``scheme://user:***@host`` in
any text (params, tags, error messages, the logged spec); ``password=...`` key/value
connection strings are masked the same way. Only ``tasks.sources.databases`` ever sees the real URL.
"""

from __future__ import annotations

import re

_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)(?P<pw>[^@\s]*)(?=@)")
_KV_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?P<pw>[^\s&;]+)", re.IGNORECASE)

MASK = "***"


def mask_secrets(text: str) -> str:
    """``text`` with every URL password and ``password=`` value replaced by ``***``."""
    if "@" not in text and "password" not in text.lower():
        return text
    text = _URL_PASSWORD.sub(lambda m: m["head"] + MASK, text)
    return _KV_PASSWORD.sub(lambda m: m["head"] + MASK, text)


def literal_password(url: str) -> bool:
    """True when ``url`` spells a password itself (``${VAR}`` from the environment is fine)."""
    m = _URL_PASSWORD.search(url)
    return bool(m and m["pw"] and not re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}", m["pw"]))
