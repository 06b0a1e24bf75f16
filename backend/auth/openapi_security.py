"""The access rules in the OpenAPI document: the two credentials (a bearer token, the dashboard's
session cookie) as security schemes, and on each operation the scope it needs (``ROUTE_ACCESS``) and
its 401, 403 and 429. Public operations carry ``security: []``. Only the document of a service run with
``--auth`` has them: without it every call is let through, and the document says no credential is asked
(docs/access.md)."""

from __future__ import annotations

from typing import Any, Final

from bubblescope.backend.auth.guard import SESSION_COOKIE
from bubblescope.backend.auth.route_access import access_of
from bubblescope.backend.auth.scopes import PUBLIC, Scope

Json = dict[str, Any]
BEARER: Final = "bearerToken"
COOKIE: Final = "sessionCookie"
SECURITY_SCHEMES: Final[Json] = {
    BEARER: {
        "type": "http",
        "scheme": "bearer",
        "description": "An API token (`bubblescope token create --scope ingest|read|admin`). "
        "Scopes: ingest (collectors), read (dashboard, GET API, /metrics), admin (everything).",
    },
    COOKIE: {
        "type": "apiKey",
        "in": "cookie",
        "name": SESSION_COOKIE,
        "description": "The dashboard's session, opened with a read or admin token by POST /api/v1/session.",
    },
}
REFUSALS: Final = {
    "401": "No token, or an unknown, malformed or revoked one: the message names the scope needed",
    "403": "The token's scope does not grant this operation, or it is bound to other runs: the message names both",
    "429": "Too many unknown tokens from this client within a minute (token guessing): retry after Retry-After",
}


def document_security(document: Json, operation: Json, method: str, path: str, error_ref: Json) -> None:
    """Add the security schemes to ``document`` and the access rule of ``method path`` to ``operation``."""
    document.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
    access = access_of(method.upper(), path) or Scope.ADMIN  # a route missing from the table needs admin
    if access == PUBLIC:
        operation["security"] = []
        return
    operation["security"] = [{BEARER: []}, {COOKIE: []}]
    scope = Scope(access).value
    either = "" if scope == Scope.ADMIN.value else " (or `admin`)"
    needed = f"Needs a token of scope `{scope}`{either} when the service runs with --auth."
    operation["description"] = f"{operation.get('description', '').rstrip()}\n\n{needed}".strip()
    responses = operation.setdefault("responses", {})
    for status, description in REFUSALS.items():
        responses.setdefault(
            status, {"description": description, "content": {"application/json": {"schema": error_ref}}}
        )
