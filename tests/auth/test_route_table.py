"""The route table (``auth.route_access.ROUTE_ACCESS``) covers every route of the app: a route added
without an entry fails here (and needs admin until it has one), so none is left open by mistake."""

from __future__ import annotations

from collections.abc import Iterator
from typing import get_args

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from bubblescope.backend.app import create_app
from bubblescope.backend.auth.guard import authorize
from bubblescope.backend.auth.route_access import ROUTE_ACCESS, RouteKey, access_of, route_keys
from bubblescope.backend.auth.schemas import ScopeName
from bubblescope.backend.auth.scopes import PUBLIC, SCOPE_NAMES, Scope, grants
from bubblescope.backend.routes import app_routes
from bubblescope.backend.settings import ServiceSettings
from tests.support import migrated_database


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    with migrated_database("sqlite", tmp_path_factory.mktemp("routes-db")) as url:
        yield create_app(url, ServiceSettings(auth=True))


def keys_of(app: FastAPI) -> dict[RouteKey, bool]:
    """Every (method, path template) of the app → whether the route runs FastAPI dependencies."""
    return {key: isinstance(route, APIRoute) for route, path in app_routes(app) for key in route_keys(route, path)}


def test_every_route_of_the_app_is_in_the_table(app: FastAPI) -> None:
    keys = keys_of(app)
    assert len(keys) >= 25  # the enumeration sees the included routers, not just the app's own routes
    missing = sorted(key for key in keys if key not in ROUTE_ACCESS)
    assert missing == [], f"add these routes to bubblescope.backend.auth.route_access.ROUTE_ACCESS: {missing}"


def test_the_table_names_only_routes_the_app_has(app: FastAPI) -> None:
    stale = sorted(set(ROUTE_ACCESS) - set(keys_of(app)))
    assert stale == [], f"ROUTE_ACCESS lists routes the app does not have: {stale}"


def test_a_route_the_guard_cannot_see_is_public(app: FastAPI) -> None:
    """A mount or a plain Starlette route runs no dependency: only a public one may be such."""
    unguarded = sorted(key for key, runs_dependencies in keys_of(app).items() if not runs_dependencies)
    assert unguarded, "the static mount and /openapi.json are expected here"
    assert [key for key in unguarded if ROUTE_ACCESS.get(key) != PUBLIC] == []


def test_every_api_route_runs_the_guard(app: FastAPI) -> None:
    assert any(dependency.dependency is authorize for dependency in app.router.dependencies)


def test_health_pages_and_assets_are_public_and_the_api_behind_them_is_not() -> None:
    public = sorted(path for (_method, path), access in ROUTE_ACCESS.items() if access == PUBLIC)
    assert public == sorted(
        [
            "/",
            "/compare",
            "/api/v1/health",
            "/api/v1/ready",
            "/api/v1/session",
            "/api/v1/session",
            "/docs",
            "/openapi.json",
            "/runs",
            "/runs/{run_key}",
            "/signin",
            "/signin",  # GET the page, POST the form without JavaScript (stores nothing)
            "/static/{path}",
            "/vendor/{name}",
        ]
    )
    assert access_of("GET", "/api/v1/runs") is Scope.READ
    assert access_of("HEAD", "/api/v1/health") == PUBLIC  # HEAD is looked up as GET
    assert access_of("GET", "/api/v1/no-such-route") is None  # the guard then asks for admin


def test_every_get_of_the_api_needs_read() -> None:
    gets = {path: access for (method, path), access in ROUTE_ACCESS.items() if method == "GET"}
    admin_only = {"/api/v1/tokens", "/api/v1/settings"}
    for path, access in gets.items():
        if path.startswith("/api/v1/") and path not in admin_only | {"/api/v1/health", "/api/v1/ready"}:
            assert access is Scope.READ, path


def test_admin_grants_every_scope_and_the_others_only_their_own() -> None:
    for needed in Scope:
        assert grants(Scope.ADMIN, needed)
        assert grants(needed, needed)
    assert not grants(Scope.READ, Scope.INGEST)
    assert not grants(Scope.INGEST, Scope.READ)
    assert not grants(Scope.READ, Scope.ADMIN)
    assert not grants(Scope.INGEST, Scope.ADMIN)


def test_the_api_schemas_take_exactly_the_scopes() -> None:
    assert set(get_args(ScopeName)) == set(SCOPE_NAMES)


def test_what_a_collector_sends_is_exactly_what_ingest_grants() -> None:
    """What a collector sends, and the upload of a profiler trace (``bubblescope import-trace`` sends the same
    registration and batches; the upload stores them in the service), of a profile's trace (what the collector
    uploads after ``POST /runs/{key}/profile``) and of a Flight Recorder dump (what a job's ranks leave behind)."""
    ingest = sorted(key for key, access in ROUTE_ACCESS.items() if access is Scope.INGEST)
    assert ingest == [
        ("POST", "/api/v1/ingest"),
        ("POST", "/api/v1/runs/{run_key}/flight-recorder"),
        ("POST", "/api/v1/runs/{run_key}/profiles/{profile_id}"),
        ("POST", "/api/v1/runs/{run_key}/traces"),
        ("PUT", "/api/v1/runs/{run_key}"),
        ("PUT", "/api/v1/runs/{run_key}/ranks/{rank}"),
        ("PUT", "/api/v1/runs/{run_key}/ranks/{rank}/end"),
    ]
