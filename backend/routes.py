"""The app's routes, walked: for the route table of the guard (``auth.route_access``) and a 405's ``Allow``."""

from __future__ import annotations

from collections.abc import Iterator

import fastapi.routing
from fastapi import FastAPI
from starlette.routing import BaseRoute


def app_routes(app: FastAPI) -> Iterator[tuple[BaseRoute, str]]:
    """Every route of ``app`` with its full path template, included routers flattened (recent FastAPI
    keeps them nested in ``app.routes``; older releases have them flat)."""
    iter_route_contexts = getattr(fastapi.routing, "iter_route_contexts", None)
    if iter_route_contexts is None:
        for route in app.routes:
            yield route, str(getattr(route, "path_format", getattr(route, "path", "")))
        return
    for context in iter_route_contexts(app.routes):
        yield context.original_route, str(context.path_format)
