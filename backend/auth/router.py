"""Signing in and out of the dashboard, and the admin endpoints for tokens.

``POST /session`` takes a read or admin token and opens a server-side session of it: the cookie (HttpOnly,
``SameSite=Strict``, ``Secure`` when the request came over https) holds the session's random text, never the
token, and the database its SHA-256. The API accepts the cookie as its token while the session lasts: signing
out ends it, the server expires it after ``SESSION_MAX_AGE_S``, revoking the token ends it. The page's scripts
never see it, and no other site's page can make the browser send it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Final

from fastapi import APIRouter, Path, Request, Response
from starlette.concurrency import run_in_threadpool

from bubblescope import wire
from bubblescope.backend.auth import queries, service
from bubblescope.backend.auth.cache import TokenCache
from bubblescope.backend.auth.guard import SESSION_COOKIE, checked_token, refusal
from bubblescope.backend.auth.schemas import SessionIn, SessionOut, TokenCreatedOut, TokenIn, TokenOut
from bubblescope.backend.auth.scopes import SIGN_IN_SCOPES, Scope
from bubblescope.backend.auth.tokens import new_session_text, new_token_text, token_digest
from bubblescope.backend.body import json_body_doc, parse_document, read_json
from bubblescope.backend.db.engine import transaction
from bubblescope.backend.db.models import ApiToken
from bubblescope.backend.db.session import DbSession
from bubblescope.backend.store import runs as run_queries

SESSION_MAX_AGE_S: Final = 7 * 24 * 3600
TOKEN_LOC: Final = ("body", "token")

router = APIRouter(prefix=wire.API_PREFIX, tags=["access"])


@router.post(
    "/session",
    response_model=SessionOut,
    openapi_extra=json_body_doc(SessionIn),
    summary="Sign in: a read or admin token becomes the dashboard's session cookie (HttpOnly, SameSite=Strict)",
    responses={
        401: {"description": "an unknown or revoked token"},
        403: {"description": "an ingest token"},
        429: {"description": "too many failed token attempts from this client lately (Retry-After)"},
    },
)
async def sign_in(request: Request, response: Response) -> SessionOut:
    body = parse_document(SessionIn, await read_json(request))
    token = await checked_token(request, body.token, TOKEN_LOC, Scope.READ)
    if token is None:
        raise refusal(401, Scope.READ, "unknown", TOKEN_LOC, "the token is not known")
    if token.revoked:
        raise refusal(401, Scope.READ, "revoked", TOKEN_LOC, f"the token {token.name!r} was revoked")
    if token.scope not in SIGN_IN_SCOPES:
        message = (
            f"the dashboard needs scope 'read' (or admin); the token {token.name!r} has scope {token.scope.value!r}"
        )
        raise refusal(403, Scope.READ, "wrong_scope", TOKEN_LOC, message)
    text = new_session_text()
    await run_in_threadpool(_store_session, request, token.id, token_digest(text))
    response.set_cookie(
        SESSION_COOKIE,
        text,
        max_age=SESSION_MAX_AGE_S,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return SessionOut(name=token.name, scope=token.scope.value)


@router.delete("/session", status_code=204, summary="Sign out: the session ends on the server and its cookie goes")
def sign_out(request: Request) -> Response:
    text = request.cookies.get(SESSION_COOKIE)
    if text:
        digest = token_digest(text)
        with transaction(request.app.state.session_factory) as session:
            queries.end_session(session, digest)
        cache: TokenCache = request.app.state.token_cache
        cache.forget_session(digest)  # this process refuses it from now on, the others within the cache's TTL
    response = Response(status_code=204)
    response.delete_cookie(
        SESSION_COOKIE, path="/", httponly=True, samesite="strict", secure=request.url.scheme == "https"
    )
    return response


@router.get("/tokens", response_model=list[TokenOut], summary="Every token: name, scope, prefix, use (never the token)")
def get_tokens(session: DbSession) -> list[ApiToken]:
    return list(service.list_tokens(session))


@router.post(
    "/tokens",
    response_model=TokenCreatedOut,
    status_code=201,
    openapi_extra=json_body_doc(TokenIn),
    summary="Create a token; the answer is the only time its text is shown",
)
async def post_token(request: Request, session: DbSession) -> TokenCreatedOut:
    body = parse_document(TokenIn, await read_json(request))
    text = new_token_text()
    created = await run_in_threadpool(service.create_token, session, body.name, body.scope, text, body.runs)
    return TokenCreatedOut.model_validate({**TokenOut.model_validate(created.row).model_dump(), "token": text})


def _store_session(request: Request, token_id: int, digest: str) -> None:
    """A new server-side session of ``token_id``, expiring with its cookie; sessions long over are forgotten."""
    with transaction(request.app.state.session_factory) as session:
        now = run_queries.database_now(session)  # the database's clock, as it compares (naive on SQLite)
        queries.purge_sessions(session, now - timedelta(days=1))
        queries.insert_session(session, token_id, digest, now + timedelta(seconds=SESSION_MAX_AGE_S))


NameOrPrefix = Annotated[str, Path(min_length=1, max_length=128, description="the token's name or its prefix")]


@router.delete(
    "/tokens/{name_or_prefix}",
    response_model=TokenOut,
    summary="Revoke a token (by name or prefix); every serve process refuses it within a few seconds",
)
def delete_token(name_or_prefix: NameOrPrefix, request: Request, session: DbSession) -> ApiToken:
    token = service.revoke_token(session, name_or_prefix)
    session.commit()
    cache: TokenCache = request.app.state.token_cache
    cache.forget()  # committed: this process refuses it from now on, the others within the cache's TTL
    return token
