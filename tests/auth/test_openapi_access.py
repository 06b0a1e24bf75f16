"""The OpenAPI document of a service run with --auth: each operation says the access it needs."""

from __future__ import annotations

from typing import Any

import httpx

from bubblescope.backend.auth.route_access import access_of
from bubblescope.backend.auth.scopes import PUBLIC
from tests.support import LiveServer

ERROR_RESPONSE = {"$ref": "#/components/schemas/ErrorResponse"}


def test_every_operation_states_the_access_it_needs(auth_server: LiveServer) -> None:
    document: dict[str, Any] = httpx.get(f"{auth_server.url}/openapi.json", timeout=30).json()
    """The schemes are the bearer token and the dashboard's cookie; each operation carries the scope of
    ROUTE_ACCESS (public ones an empty ``security``) and, when guarded, its 401 and 403."""
    schemes = document["components"]["securitySchemes"]
    assert schemes["bearerToken"] == {**schemes["bearerToken"], "type": "http", "scheme": "bearer"}
    assert schemes["sessionCookie"]["in"] == "cookie"
    checked = 0
    for path, item in document["paths"].items():
        for method, operation in item.items():
            access = access_of(method.upper(), path)
            assert access is not None, f"{method} {path} is not in ROUTE_ACCESS"
            if access == PUBLIC:
                assert operation["security"] == [], (method, path)
                continue
            assert operation["security"] == [{"bearerToken": []}, {"sessionCookie": []}], (method, path)
            assert f"scope `{access.value}`" in operation["description"], (method, path)
            for status in ("401", "403", "429"):
                assert operation["responses"][status]["content"]["application/json"]["schema"] == ERROR_RESPONSE
            checked += 1
    assert checked >= 15
