"""A token's text, its digest and its prefix. The text is shown once, at creation; the database keeps
its SHA-256 (hex) and its first characters, by which a person tells tokens apart in a list."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import Final

TOKEN_MARK: Final = "bs_"
PREFIX_CHARS: Final = 10
"""``bs_`` and 7 characters of the secret: enough to tell tokens apart, far too few to guess the rest."""
MIN_TOKEN_CHARS: Final = 32
MAX_TOKEN_CHARS: Final = 256
TOKEN_TEXT_PATTERN: Final = r"^[!-~]+$"
"""A token's characters: printable ASCII without space (what fits an Authorization header)."""
_TOKEN_TEXT = re.compile(TOKEN_TEXT_PATTERN)


def new_token_text() -> str:
    """A new token: ``bs_`` and 256 random bits, URL-safe."""
    return TOKEN_MARK + secrets.token_urlsafe(32)


SESSION_MARK: Final = "bss_"


def new_session_text() -> str:
    """A dashboard session's cookie: ``bss_`` and 256 random bits (the database keeps its SHA-256)."""
    return SESSION_MARK + secrets.token_urlsafe(32)


def token_digest(text: str) -> str:
    """The SHA-256 of the token's text, hex: what the database stores and is searched by."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def token_prefix(text: str) -> str:
    return text[:PREFIX_CHARS]


def same_digest(stored: str, presented: str) -> bool:
    """Constant-time comparison of two digests (the lookup found ``stored`` by ``presented``; comparing
    again this way leaves no timing difference to learn from, whatever the database's index does)."""
    return hmac.compare_digest(stored.encode(), presented.encode())


def token_text_problem(text: str) -> str | None:
    """Why ``text`` cannot be a token someone chose (``token create --value-env``), or None."""
    if not MIN_TOKEN_CHARS <= len(text) <= MAX_TOKEN_CHARS:
        return f"is {len(text)} characters; a token has {MIN_TOKEN_CHARS} to {MAX_TOKEN_CHARS}"
    if not _TOKEN_TEXT.fullmatch(text):
        return "has a character that is not printable ASCII (or a space): it could not be sent in a header"
    return None


TOKEN_NAME_PATTERN: Final = r"^[A-Za-z0-9._:@-]{1,128}$"
"""A token's name: who or what holds it (``ci``, ``alice@example.org``, ``cluster-a.collectors``)."""


def token_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a token, or None."""
    if re.fullmatch(TOKEN_NAME_PATTERN, name):
        return None
    return "must be 1 to 128 letters, digits or . _ : @ -"
