"""Helpers of the access tests: tokens written straight into a database, bearer headers, /metrics."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

import httpx

from bubblescope.backend.auth.scopes import Scope
from bubblescope.backend.auth.service import create_token, revoke_token
from bubblescope.backend.auth.tokens import new_token_text
from bubblescope.backend.db.engine import build_engine, build_session_factory, transaction

TRUSTED_HEADER = "X-Forwarded-User"


def make_token(db_url: str, scope: Scope, revoked: bool = False, runs: list[str] | None = None) -> str:
    """A new token of ``scope`` stored in ``db_url``, bound to ``runs`` (revoked at once when asked); its text."""
    name = f"{scope.value}-{uuid.uuid4().hex[:8]}"
    text = new_token_text()
    engine = build_engine(db_url)
    try:
        with transaction(build_session_factory(engine)) as session:
            create_token(session, name, scope.value, text, runs)
            if revoked:
                revoke_token(session, name)
    finally:
        engine.dispose()
    return text


BOUND_PREFIX = "matrix-"
"""The runs the ``bound_here`` tokens may touch: keys starting with it."""


@dataclass(frozen=True)
class Tokens:
    """A valid and a revoked token of each scope; for ingest and read, one bound to the runs ``matrix-*`` and one
    bound to another team's runs."""

    valid: dict[Scope, str]
    revoked: dict[Scope, str]
    bound_here: dict[Scope, str]
    bound_elsewhere: dict[Scope, str]


def issue_tokens(db_url: str) -> Tokens:
    bindable = (Scope.INGEST, Scope.READ)
    return Tokens(
        valid={scope: make_token(db_url, scope) for scope in Scope},
        revoked={scope: make_token(db_url, scope, revoked=True) for scope in Scope},
        bound_here={scope: make_token(db_url, scope, runs=[BOUND_PREFIX + "*"]) for scope in bindable},
        bound_elsewhere={scope: make_token(db_url, scope, runs=["other-team-*", "matrix"]) for scope in bindable},
    )


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def auth_failures(client: httpx.Client, read_token: str) -> dict[str, float]:
    """``bubblescope_auth_failures_total`` by reason, as the service's /metrics says now."""
    response = client.get("/metrics", headers=bearer(read_token))
    assert response.status_code == 200, response.text
    found = re.findall(r'^bubblescope_auth_failures_total\{reason="(\w+)"\} (\S+)$', response.text, re.M)
    return {reason: float(value) for reason, value in found}
