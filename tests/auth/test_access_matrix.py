"""Every guarded route of the table × {no token, a token of the wrong scope, a revoked token, the right
token, an admin token}: 401, 403, 401, and neither for the last two. Generated from the route table
(which ``test_route_table`` holds to the app's routes), so a new route is tried here too. On SQLite
and PostgreSQL."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from bubblescope.backend.auth.route_access import ANY_METHOD, ROUTE_ACCESS
from bubblescope.backend.auth.scopes import PUBLIC, Scope
from tests.auth.support import Tokens, bearer, issue_tokens
from tests.support import LiveServer, migrated_database, start_server

GUARDED = sorted((method, path, access) for (method, path), access in ROUTE_ACCESS.items() if access != PUBLIC)
PUBLIC_ROUTES = sorted((method, path) for (method, path), access in ROUTE_ACCESS.items() if access == PUBLIC)
WRONG_SCOPE = {Scope.INGEST: Scope.READ, Scope.READ: Scope.INGEST, Scope.ADMIN: Scope.READ}


@dataclass(frozen=True)
class Service:
    server: LiveServer
    tokens: Tokens
    run_key: str


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], ids=lambda p: p
)
def service(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with migrated_database(request.param, tmp_path_factory.mktemp("matrix-db")) as url:
        tokens = issue_tokens(url)
        live = start_server(url, tmp_path_factory.mktemp("matrix-server"), extra_args=["--auth"])
        key = f"matrix-{uuid.uuid4().hex[:8]}"
        with live.client() as client:
            registered = client.put(
                f"/api/v1/runs/{key}",
                json={"name": "matrix", "world_size": 1},
                headers=bearer(tokens.valid[Scope.INGEST]),
            )
            assert registered.status_code == 200, registered.text
        try:
            yield Service(live, tokens, key)
        finally:
            live.stop()


def concrete(path: str, run_key: str) -> str:
    """The route's path with a value for each parameter (a new parameter needs one here)."""
    values = {
        "run_key": run_key,
        "rank": "0",
        "step": "0",
        "name_or_prefix": "no-such-token",
        "name": "plotly.min.js",
        "path": "style.css",
        "profile_id": "1",
    }
    return re.sub(r"\{(\w+)\}", lambda match: values[match.group(1)], path)


def call(client: httpx.Client, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
    """One request; a write carries an empty JSON object (refused with 422 once past the guard, so
    nothing is changed by the right token either)."""
    body = {"json": {}} if method in ("POST", "PUT") else {}
    return client.request(method, path, headers=headers, **body)


@pytest.mark.parametrize(("method", "template", "needed"), GUARDED, ids=[f"{m} {p}" for m, p, _ in GUARDED])
def test_a_guarded_route_refuses_all_but_its_scope_and_admin(
    service: Service, method: str, template: str, needed: Scope
) -> None:
    # DELETE of a run: a key never registered, so the right token's 404 leaves the run for the others
    run_key = f"absent-{uuid.uuid4().hex[:6]}" if method == "DELETE" else service.run_key
    path = concrete(template, run_key)
    wrong = WRONG_SCOPE[needed]
    with service.server.client() as client:
        anonymous = call(client, method, path, {})
        assert anonymous.status_code == 401, anonymous.text
        challenge = anonymous.headers["WWW-Authenticate"]
        assert challenge == f'Bearer realm="bubblescope", scope="{needed.value}"'
        [detail] = anonymous.json()["detail"]
        assert detail["loc"] == ["header", "Authorization"] and detail["type"] == "unauthorized"
        assert f"scope '{needed.value}'" in detail["msg"]

        forbidden = call(client, method, path, bearer(service.tokens.valid[wrong]))
        assert forbidden.status_code == 403, forbidden.text
        message = forbidden.json()["detail"][0]["msg"]
        assert f"needs scope '{needed.value}'" in message and f"has scope '{wrong.value}'" in message
        assert 'error="insufficient_scope"' in forbidden.headers["WWW-Authenticate"]

        revoked = call(client, method, path, bearer(service.tokens.revoked[needed]))
        assert revoked.status_code == 401, revoked.text
        assert "revoked" in revoked.json()["detail"][0]["msg"]
        assert revoked.headers["WWW-Authenticate"].endswith('error="invalid_token"')

        for scope in (needed, Scope.ADMIN):
            allowed = call(client, method, path, bearer(service.tokens.valid[scope]))
            assert allowed.status_code not in (401, 403), f"{scope.value}: {allowed.text}"
            assert allowed.status_code < 500, allowed.text


RUN_ROUTES = [(m, p, a) for m, p, a in GUARDED if "{run_key}" in p and a is not Scope.ADMIN]


@pytest.mark.parametrize(("method", "template", "needed"), RUN_ROUTES, ids=[f"{m} {p}" for m, p, _ in RUN_ROUTES])
def test_a_token_bound_to_runs_reaches_a_runs_routes_for_those_runs_alone(
    service: Service, method: str, template: str, needed: Scope
) -> None:
    """Another team's token of the right scope is refused (403 naming the run key), whatever the route; the token
    bound to this run's prefix passes. (A pattern is a whole key unless it ends in *: 'matrix' is not 'matrix-…'.)"""
    path = concrete(template, service.run_key)
    with service.server.client() as client:
        elsewhere = call(client, method, path, bearer(service.tokens.bound_elsewhere[needed]))
        assert elsewhere.status_code == 403, elsewhere.text
        [detail] = elsewhere.json()["detail"]
        assert detail["loc"] == ["path", "run_key"] and detail["type"] == "forbidden"
        assert f"'{service.run_key}' is not one of them" in detail["msg"] and "'other-team-*'" in detail["msg"]
        here = call(client, method, path, bearer(service.tokens.bound_here[needed]))
        assert here.status_code not in (401, 403) and here.status_code < 500, here.text


@pytest.mark.parametrize(("method", "template"), PUBLIC_ROUTES, ids=[f"{m} {p}" for m, p in PUBLIC_ROUTES])
def test_a_public_route_answers_without_a_token(service: Service, method: str, template: str) -> None:
    method = "GET" if method == ANY_METHOD else method
    with service.server.client() as client:
        answer = call(client, method, concrete(template, service.run_key), {})
    assert answer.status_code not in (401, 403), answer.text
    assert answer.status_code < 500, answer.text
