"""A query parameter that takes one value, given several times, is a 422 that names it. FastAPI keeps
the last value silently, so ``?name=a&name=b`` answered for ``b`` only (found by the API fuzz). Which
parameters take several values is read from the route's own OpenAPI description: one source. No query
value may hold a NUL character."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.routing import APIRoute

from bubblescope.backend.errors import Invalid


def one_value_each(request: Request) -> None:
    """An app dependency: refuses a repeated query parameter unless the route takes a list of it."""
    params = request.query_params
    repeated = sorted({name for name in params if len(params.getlist(name)) > 1})
    route = request.scope.get("route")
    if not repeated or not isinstance(route, APIRoute):
        return
    lists = _list_parameters(request, route.path_format, request.method.lower())
    for name in repeated:
        if name not in lists:
            raise Invalid(("query", name[:64]), f"given {len(params.getlist(name))} times; it takes one value")


def no_nul_characters(request: Request) -> None:
    """An app dependency: a query value holding NUL is a 422 that names it (PostgreSQL cannot compare
    text with NUL in it: a run key or a search text with one was a 500, found by the API fuzz)."""
    for name, value in request.query_params.multi_items():
        if "\x00" in value:
            raise Invalid(("query", name[:64]), "must not contain NUL characters")


def _list_parameters(request: Request, path: str, method: str) -> frozenset[str]:
    cache: dict[tuple[str, str], frozenset[str]] = request.app.state.list_query_parameters
    if (path, method) not in cache:
        operation = request.app.openapi().get("paths", {}).get(path, {}).get(method, {})
        cache[(path, method)] = frozenset(
            p["name"]
            for p in operation.get("parameters", [])
            if p.get("in") == "query" and _is_array(p.get("schema", {}))
        )
    return cache[(path, method)]


def _is_array(schema: dict[str, Any]) -> bool:
    return schema.get("type") == "array" or any(_is_array(option) for option in schema.get("anyOf", []))
