"""Creating, listing and revoking API tokens: for the ``token`` commands and the admin endpoints."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from bubblescope.backend.auth import queries
from bubblescope.backend.auth.run_scope import run_patterns_problem
from bubblescope.backend.auth.scopes import SCOPE_NAMES, Scope
from bubblescope.backend.auth.tokens import token_digest, token_name_problem, token_prefix
from bubblescope.backend.caller import scope_text
from bubblescope.backend.db.models import ApiToken
from bubblescope.backend.errors import Invalid, NotFound


@dataclass(frozen=True)
class CreatedToken:
    row: ApiToken
    created: bool
    """False: the same token text was already stored with this scope (``--value-env`` run again)."""


def create_token(session: Session, name: str, scope: str, text: str, runs: Sequence[str] | None = None) -> CreatedToken:
    """Store the token ``text`` (its digest) under ``name`` with ``scope``, bound to ``runs`` (None: every run;
    ``run_scope``).

    The same text again with the same scope and runs is no change (``created`` False), so a deployment can set
    a known token at every start; with another scope or other runs, or once revoked, it is refused. A name is
    held by one token at a time until that one is revoked."""
    problem = token_name_problem(name)
    if problem:
        raise Invalid("name", f"{name!r} {problem}")
    if scope not in SCOPE_NAMES:
        raise Invalid("scope", f"{scope!r} is not a scope; one of {', '.join(SCOPE_NAMES)}")
    bound = _bound_runs(scope, runs)
    digest = token_digest(text)
    existing = queries.find_by_digest(session, digest)
    if existing is None:
        holder = queries.active_named(session, name)
        if holder is not None:
            raise Invalid("name", f"a token named {name!r} exists (prefix {holder.prefix}); revoke it or pick another")
        try:
            with session.begin_nested():
                return CreatedToken(queries.insert(session, name, scope, digest, token_prefix(text), bound), True)
        except IntegrityError:  # the same text stored at the same moment by another process
            existing = queries.find_by_digest(session, digest)
            if existing is None:
                raise
    if existing.revoked_at is not None:
        raise Invalid("token", f"this token ({existing.prefix}, {existing.name!r}) was revoked; use a new one")
    if existing.scope != scope:
        raise Invalid(
            "scope", f"this token is stored as {existing.name!r} with scope {existing.scope!r}, not {scope!r}"
        )
    if existing.runs != bound:
        held = "every run" if existing.runs is None else f"runs {scope_text(existing.runs)}"
        raise Invalid("runs", f"this token is stored as {existing.name!r} for {held}; revoke it to change that")
    return CreatedToken(existing, False)


def _bound_runs(scope: str, runs: Sequence[str] | None) -> list[str] | None:
    """The runs a new token is bound to, checked; an admin token is never bound."""
    if runs is None:
        return None
    if scope == Scope.ADMIN.value:
        raise Invalid("runs", "an admin token is not bound to runs (it manages every team's); give ingest or read")
    problem = run_patterns_problem(runs)
    if problem:
        raise Invalid("runs", problem)
    return list(dict.fromkeys(runs))  # in order, once each


def list_tokens(session: Session) -> Sequence[ApiToken]:
    return queries.all_tokens(session)


def revoke_token(session: Session, name_or_prefix: str) -> ApiToken:
    """Revoke the one token not yet revoked whose name or prefix is ``name_or_prefix``."""
    matches = queries.active_matching(session, name_or_prefix)
    if not matches:
        revoked = queries.revoked_matching(session, name_or_prefix)
        already = " (a revoked one has: it is revoked already)" if revoked else ""
        raise NotFound(
            "name_or_prefix", f"no token that is not revoked has the name or prefix {name_or_prefix!r}{already}"
        )
    if len(matches) > 1:
        listed = ", ".join(f"{token.name!r} ({token.prefix})" for token in matches)
        raise Invalid(
            "name_or_prefix", f"{name_or_prefix!r} matches {len(matches)} tokens: {listed}; give one's prefix"
        )
    token = matches[0]
    queries.revoke(session, token.id)
    session.refresh(token)
    return token


def has_active_tokens(session: Session) -> bool:
    return queries.count_active(session) > 0
