"""What the guard (``auth.guard``, a feature) learned of the caller, for every other part to read without
importing it: the runs a token bound to runs may touch (``auth.run_scope``) and whether the caller proved who it
is (``errors.sees_internals`` reads that). Set on ``request.state`` by the guard; absent, the caller may touch
every run (auth off, an unbound token, a proxy's user)."""

from __future__ import annotations

from typing import Final

from fastapi import Request

from bubblescope.backend.errors import ApiError, Loc
from bubblescope.backend.service_metrics import AUTH_FAILURES

REALM: Final = "bubblescope"
RunScope = tuple[str, ...] | None
"""None: every run; else run keys, or key prefixes ending in ``*``."""


def run_scope_of(request: Request) -> RunScope:
    """The runs the caller may touch: None for every run."""
    scope: RunScope = getattr(request.state, "run_scope", None)
    return scope


def run_in_scope(scope: RunScope, run_key: str) -> bool:
    """Whether a token bound to ``scope`` may touch the run ``run_key``."""
    if scope is None:
        return True
    return any(run_key.startswith(p[:-1]) if p.endswith("*") else run_key == p for p in scope)


def scope_text(scope: tuple[str, ...] | list[str]) -> str:
    return ", ".join(repr(pattern) for pattern in scope)


def require_run_in_scope(request: Request, run_key: str, loc: Loc) -> None:
    """403 when the caller's token is bound to runs that do not include ``run_key`` (named at ``loc``)."""
    scope = run_scope_of(request)
    if scope is None or run_in_scope(scope, run_key):
        return
    AUTH_FAILURES.labels("wrong_run").inc()
    message = f"the token may touch only the runs {scope_text(scope)}; {run_key!r} is not one of them"
    challenge = f'Bearer realm="{REALM}", error="insufficient_scope"'
    raise ApiError(403, loc, message, "forbidden", headers={"WWW-Authenticate": challenge})
