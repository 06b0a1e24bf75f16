"""The dependency every API route runs (``create_app``): with ``serve --auth``, the call must carry a
token whose scope grants what the route needs (``route_access.ROUTE_ACCESS``).

A request is authenticated by the first of these it carries:

1. ``Authorization: Bearer <token>``;
2. the dashboard's session cookie (``SESSION_COOKIE``, set by ``POST /api/v1/session``), which names a
   session the server keeps (ended by signing out, expired by the server, ended with its token's revocation)
   and counts as its token;
3. with ``--trusted-user-header H``: a non-empty header ``H``, set by a reverse proxy that signed the
   user in (SSO); it gives ``read``. The proxy must remove ``H`` from what clients send.

No credential, an unknown or revoked token: 401 with ``WWW-Authenticate: Bearer realm="bubblescope",
scope="<needed>"`` (and ``error="invalid_token"`` for a token that was sent). A valid token of a scope
that does not grant the route: 403 naming both scopes. Every refusal is counted in
``bubblescope_auth_failures_total{reason}``. Without ``--auth`` every route is open.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from bubblescope.backend.auth.cache import KnownToken, TokenCache
from bubblescope.backend.auth.route_access import access_of
from bubblescope.backend.auth.scopes import PUBLIC, Access, Scope, grants
from bubblescope.backend.auth.throttle import WINDOW_S, FailedAttempts
from bubblescope.backend.auth.tokens import token_digest
from bubblescope.backend.caller import REALM, require_run_in_scope, scope_text
from bubblescope.backend.errors import ApiError, Loc
from bubblescope.backend.service_metrics import AUTH_FAILURES
from bubblescope.backend.settings import from_trusted_proxy, peer_address, settings_of

SESSION_COOKIE: Final = "bubblescope_session"
AUTHORIZATION_LOC: Final = ("header", "Authorization")
log = logging.getLogger("bubblescope.auth")
SERVICE_WIDE: Final = frozenset({"/metrics"})
"""Routes whose answer is every run's, which a token bound to runs may not call."""
SAYS_MORE_TO_KNOWN: Final = frozenset({"/api/v1/health", "/api/v1/ready"})
"""Public routes that tell a caller with a valid token more (the database's error words): ``note_credential``."""


@dataclass(frozen=True)
class Credential:
    text: str
    loc: Loc  # where the request carried it
    session: bool = False  # a dashboard session's cookie, not a token


async def authorize(request: Request) -> None:
    """Let the call through, or refuse it with 401 or 403 (see the module docstring)."""
    settings = settings_of(request)
    if not settings.auth:
        return
    needed = needed_access(request)
    if needed == PUBLIC:
        if _route_template(request) in SAYS_MORE_TO_KNOWN:
            await note_credential(request)
        return
    assert isinstance(needed, Scope)
    credential = presented_credential(request)
    if credential is None:
        user = trusted_user(request)
        if user is not None:
            name, header = user
            _require_grant(needed, Scope.READ, f"the user {name!r} signed in through the proxy", ("header", header))
            request.state.authenticated = True
            return
        raise refusal(401, needed, "missing", AUTHORIZATION_LOC, _missing_message(needed))
    if credential.text == "":
        raise refusal(401, needed, "malformed", credential.loc, f"send 'Bearer <token>'; {_needs(needed)}")
    token = await checked_token(request, credential.text, credential.loc, needed, credential.session)
    if token is None:
        raise refusal(401, needed, "unknown", credential.loc, f"{_unknown(credential)}; {_needs(needed)}")
    if token.revoked:
        raise refusal(401, needed, "revoked", credential.loc, f"the token {token.name!r} was revoked; {_needs(needed)}")
    _require_grant(needed, token.scope, f"the token {token.name!r}", credential.loc)
    request.state.run_scope = token.runs
    request.state.authenticated = True
    if token.runs is not None:
        _require_route_in_scope(request, needed, token)
    cache: TokenCache = request.app.state.token_cache
    if cache.claim_touch(token.id):
        await run_in_threadpool(cache.touch, token.id)


async def note_credential(request: Request) -> None:
    """For a public route that says more to a known caller (health, readiness): marks the request authenticated
    when it carries a token this process has already seen valid. No lookup (these answer without the database,
    and guessing here is not a way round the throttle); refuses nothing."""
    if not settings_of(request).auth:
        return
    credential = presented_credential(request)
    if credential is not None and credential.text:
        cache: TokenCache = request.app.state.token_cache
        token = cache.remembered(token_digest(credential.text), credential.session)
        request.state.authenticated = token is not None and not token.revoked
        return
    try:
        request.state.authenticated = trusted_user(request) is not None
    except ApiError:  # the header from elsewhere: not known, and a public route answers anyway
        request.state.authenticated = False


def _require_route_in_scope(request: Request, needed: Scope, token: KnownToken) -> None:
    """A token bound to runs reaches a run's routes for its runs only, and no service-wide figures."""
    run_key = request.path_params.get("run_key")
    if isinstance(run_key, str):
        require_run_in_scope(request, run_key, ("path", "run_key"))
    if _route_template(request) in SERVICE_WIDE:
        message = (
            f"the token {token.name!r} is bound to runs ({scope_text(token.runs or ())}); this endpoint shows every "
            "run's: use a token for every run (Prometheus's, say)"
        )
        raise refusal(403, needed, "wrong_run", AUTHORIZATION_LOC, message)


def _route_template(request: Request) -> str:
    route = request.scope.get("route")
    return str(getattr(route, "path_format", None) or request.url.path)


def needed_access(request: Request) -> Access:
    """What the called route needs; a route missing from the table needs admin (and a test fails)."""
    template = _route_template(request)
    access = access_of(request.method, template)
    if access is None:
        log.error("bubblescope: %s %s is not in auth.route_access.ROUTE_ACCESS; admin only", request.method, template)
        return Scope.ADMIN
    return access


def presented_credential(request: Request) -> Credential | None:
    """The bearer token, else the session cookie; a malformed Authorization header is an empty text."""
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, text = header.strip().partition(" ")
        return Credential(text.strip() if scheme.lower() == "bearer" else "", AUTHORIZATION_LOC)
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        return Credential(cookie, ("cookie", SESSION_COOKIE), session=True)
    return None


def trusted_user(request: Request) -> tuple[str, str] | None:
    """(the user, the header) when ``--trusted-user-header`` names a header the request carries, non-empty, on a
    connection from a ``--trusted-proxy``. The header from anyone else, or twice, is refused (401)."""
    settings = settings_of(request)
    header = settings.trusted_user_header
    if not header:
        return None
    values = request.headers.getlist(header)
    if not any(value.strip() for value in values):
        return None
    loc = ("header", header)
    peer = peer_address(request)
    if not from_trusted_proxy(settings, peer):
        message = f"{header} is honoured only from the proxies of --trusted-proxy; this connection came from {peer}"
        raise refusal(401, Scope.READ, "untrusted_proxy", loc, message)
    if len(values) > 1:
        raise refusal(401, Scope.READ, "malformed", loc, f"{header} came {len(values)} times; a proxy sets it once")
    return values[0].strip(), header


async def checked_token(
    request: Request, text: str, loc: Loc, needed: Scope, session: bool = False
) -> KnownToken | None:
    """The token ``text`` is (with ``session``: the token of the dashboard session ``text`` names), from the cache
    or the database (on a worker thread), None when unknown (or an ended or expired session); unless its client
    sent too many unknown tokens lately
    (``throttle``): then 429 without a lookup, save for a token the service has already seen valid.

    A token that needs a lookup counts against its client before the lookup, and is forgiven once found, so
    guesses sent all at once are counted as they arrive. A session cookie never counts (256 random bits: nobody
    guesses one; an old tab's expired cookie must not throttle its neighbours)."""
    client = client_address(request)
    attempts: FailedAttempts = request.app.state.failed_attempts
    cache: TokenCache = request.app.state.token_cache
    digest = token_digest(text)
    wait_s = attempts.wait_s(client)
    if wait_s:
        seen = cache.remembered(digest, session)
        if seen is None or seen.revoked:
            message = f"{attempts.max_failures} unknown tokens from {client} within {WINDOW_S:g} s; retry in {wait_s} s"
            error = refusal(429, needed, "throttled", loc, message)
            error.headers = {**(error.headers or {}), "Retry-After": str(wait_s)}
            raise error
    found, token = cache.cached(digest, session)
    if found:
        return token  # no lookup: nothing to count
    if not session:
        attempts.failed(client)  # counted now: a burst of guesses cannot all pass before the first is refused
    token = await run_in_threadpool(cache.load_session if session else cache.load, digest)
    if token is not None and not session:
        attempts.forgive(client)
    return token


def client_address(request: Request) -> str:
    """The client as uvicorn sees it (X-Forwarded-For's word from a proxy it trusts)."""
    return request.client.host if request.client else "unknown"


def refusal(status: int, needed: Scope, reason: str, loc: Loc, message: str) -> ApiError:
    """A 401 or 403 naming the scope needed, counted by ``reason``."""
    AUTH_FAILURES.labels(reason).inc()
    challenge = f'Bearer realm="{REALM}", scope="{needed.value}"'
    if status == 403:
        challenge += ', error="insufficient_scope"'
    elif reason in ("unknown", "revoked", "malformed"):
        challenge += ', error="invalid_token"'
    error_type = {403: "forbidden", 429: "rate_limited"}.get(status, "unauthorized")
    return ApiError(status, loc, message, error_type, headers={"WWW-Authenticate": challenge})


def _require_grant(needed: Scope, held: Scope, who: str, loc: Loc) -> None:
    if not grants(held, needed):
        message = f"this endpoint needs scope {needed.value!r}; {who} has scope {held.value!r}"
        raise refusal(403, needed, "wrong_scope", loc, message)


def _unknown(credential: Credential) -> str:
    if credential.session:
        return "the session is not known (signed out, expired, or its token revoked): sign in again"
    return "the token is not known"


def _needs(needed: Scope) -> str:
    alternative = "" if needed is Scope.ADMIN else " (or admin)"
    return f"this endpoint needs a token with scope {needed.value!r}{alternative}"


def _missing_message(needed: Scope) -> str:
    return f"{_needs(needed)}: send 'Authorization: Bearer <token>', or sign in on the dashboard"
