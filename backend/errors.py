"""One error shape for every error status, and the one place where errors become HTTP statuses.

The shape is FastAPI's own validation shape, ``{"detail": [{"loc": [...], "msg": "...", "type": "..."}]}``,
so clients parse request-validation errors and ours alike: ``loc`` names the field
(``["body", "spans", "end_ns", 17]``), ``msg`` says what is wrong.

Services and the analysis raise *domain* errors that name the field they are about (``run_key``,
``from_step``, ``config.tp``) but not where the request carried it, nor a status:

- ``NotFound`` (404), ``Invalid`` (422) and ``TooLarge`` (413), raised by the services;
- ``bubblescope.analysis.errors.InputError`` and its kinds (a schedule, a profile or a plan the
  analysis cannot work with): 422.

``install_error_handlers`` maps each to its status and puts the field under ``path``, ``query`` or
``body`` by looking it up in the parameters of the route that was called. ``ApiError`` is for the
HTTP layer itself (reading a body: 400, 413, 415; busy: 503), which knows its status.

The rest keeps the shape too: an unknown path or method (404, 405), a database that cannot be
reached or is locked (503 with ``Retry-After``: nothing was stored, retry), and any bug (500, its
traceback in the service's log, not in the answer).
"""

from __future__ import annotations

import html
import logging
from collections.abc import Sequence
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import ValidationError
from sqlalchemy.exc import (
    DBAPIError,
    InterfaceError as DbInterfaceError,
    OperationalError,
    SQLAlchemyError,
    TimeoutError as PoolTimeout,
)
from starlette.exceptions import HTTPException
from starlette.routing import compile_path

from bubblescope.analysis import InputError
from bubblescope.backend.settings import settings_of

Loc = Sequence[str | int]
MAX_ERRORS = 50
_LOCATIONS = ("path", "query", "body")


class ApiError(Exception):
    """An HTTP-layer error with its status and full location (``["body"]``, ``["path", "name"]``)."""

    def __init__(
        self, status: int, loc: Loc, msg: str, error_type: str = "value_error", headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(msg)
        self.status = status
        self.headers = headers
        self.errors: list[dict[str, Any]] = [{"loc": list(loc), "msg": msg, "type": error_type}]


class DomainError(Exception):
    """A request a service cannot serve; ``field`` is a name or a path (``("spans", "end_ns", 17)``)."""

    status: ClassVar[int] = 422
    error_type: ClassVar[str] = "value_error"

    def __init__(self, field: str | Loc, message: str) -> None:
        super().__init__(message)
        self.field: tuple[str | int, ...] = (field,) if isinstance(field, str) else tuple(field)
        self.message = message
        self.headers: dict[str, str] | None = None


class NotFound(DomainError):
    status = 404
    error_type = "not_found"


class Invalid(DomainError):
    status = 422


class TooLarge(DomainError):
    status = 413
    error_type = "too_large"


class Conflict(DomainError):
    """What the request asks contradicts what is stored (a trace imported into a collected run): 409."""

    status = 409
    error_type = "conflict"


class TooMany(DomainError):
    """A per-run rate limit: 429, with when to try again."""

    status = 429
    error_type = "rate_limited"

    def __init__(self, field: str | Loc, message: str, retry_after_s: int) -> None:
        super().__init__(field, message)
        self.headers = {"Retry-After": str(max(1, retry_after_s))}


def from_validation_error(error: ValidationError, prefix: Loc = ("body",)) -> ApiError:
    """Turn a pydantic error into a 422 ApiError whose locations start at ``prefix``."""
    api_error = ApiError(422, prefix, "invalid request")
    api_error.errors = [
        {"loc": [*prefix, *item["loc"]], "msg": item["msg"], "type": item["type"]}
        for item in error.errors(include_url=False, include_context=False, include_input=False)
    ][:MAX_ERRORS]
    return api_error


def locate(request: Request, field: Sequence[str | int]) -> list[str | int]:
    """``field`` under ``path`` or ``query`` when the called route has such a parameter, else ``body``."""
    if field and field[0] in _LOCATIONS:
        return list(field)
    dependant = getattr(request.scope.get("route"), "dependant", None)
    if field and dependant is not None:
        for where, params in (("path", dependant.path_params), ("query", dependant.query_params)):
            if any(field[0] in (param.name, param.alias) for param in params):
                return [where, *field]
    return ["body", *field]


def wants_page(request: Request) -> bool:
    """A browser navigating (it asks for HTML first), not an API client (JSON, or anything)."""
    return request.method == "GET" and "text/html" in request.headers.get("accept", "")


def _missing_page(path: str) -> HTMLResponse:
    """A browser's 404: a page that says what is not here and where to go, not the API's JSON."""
    shown = html.escape(path)
    body = (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Not here · Bubblescope</title>"
        "<link rel='stylesheet' href='/static/style.css'></head><body><main>"
        f"<h1>Nothing at {shown}</h1><p>The runs this service knows are on <a href='/'>the run list</a>; a run's "
        "page is <code>/runs/KEY</code> (or <code>/runs/NAME</code>: its newest run). The API lives under "
        "<code>/api/v1</code> (<a href='/docs'>its reference</a>).</p></main></body></html>"
    )
    return HTMLResponse(body, status_code=404)


def _response(status: int, loc: Loc, msg: str, error_type: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        status_code=status, content={"detail": [{"loc": list(loc), "msg": msg, "type": error_type}]}, headers=headers
    )


def database_unavailable(error: BaseException) -> bool:
    """Whether ``error`` means the database cannot serve now (down, unreachable, locked, dropped)."""
    if isinstance(error, (OperationalError, DbInterfaceError, PoolTimeout)):
        return True
    return isinstance(error, DBAPIError) and error.connection_invalidated


def first_line(error: BaseException) -> str:
    """The driver's message without SQLAlchemy's statement and background link."""
    text = str(getattr(error, "orig", None) or error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def busy(what: str, retry_after_s: int) -> ApiError:
    """The 503 for a service that is behind: ``what`` says on what; retry after the delay."""
    return ApiError(
        503, [], f"busy: {what}; retry after {retry_after_s} s", "busy", headers={"Retry-After": str(retry_after_s)}
    )


def database_unavailable_error(
    error: BaseException, retry_after_s: int, loc: Loc = (), detail: bool = True
) -> ApiError:
    """The 503 for a database that cannot serve now: nothing was stored, retry. ``detail``: with the database's
    own words (its host and port among them), for a caller who may see them (``sees_internals``)."""
    why = f": {first_line(error)}" if detail else " (send a token to see why)"
    return ApiError(
        503,
        loc,
        f"database unavailable{why}; nothing was stored, retry after {retry_after_s} s",
        "database_unavailable",
        {"Retry-After": str(retry_after_s)},
    )


def sees_internals(request: Request) -> bool:
    """Whether the caller may read the database's own error words (its host and port): with ``--auth``, only a
    caller that sent a valid credential (``auth.guard`` marks it on ``request.state``); without, everyone who
    reaches the service."""
    return not settings_of(request).auth or bool(getattr(request.state, "authenticated", False))


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app answers at the request's path, sorted (a route per method: Starlette's
    405 names only the first one it met)."""
    from bubblescope.backend.routes import app_routes  # the app's routes, included routers flattened

    path = request.scope["path"]
    methods: set[str] = set()
    for route, template in app_routes(request.app):
        route_methods = getattr(route, "methods", None)
        if route_methods and compile_path(template)[0].match(path):
            methods |= set(route_methods)
    return sorted(methods)


def error_type(error: BaseException) -> str:
    """The ``type`` the answer to ``error`` carries (a metric's reason label)."""
    if isinstance(error, ApiError):
        return str(error.errors[0]["type"]) if error.errors else "invalid"
    if isinstance(error, DomainError):
        return error.error_type
    if isinstance(error, (InputError, RequestValidationError, ValidationError)):
        return "value_error"
    if isinstance(error, SQLAlchemyError):
        return "database_unavailable" if database_unavailable(error) else "internal"
    return "internal"


_HTTP_ERROR_TYPES = {404: "not_found", 405: "method_not_allowed"}
log = logging.getLogger("bubblescope.service")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(status_code=error.status, content={"detail": error.errors}, headers=error.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> Response:
        msg = error.detail if isinstance(error.detail, str) else str(error.detail)
        if error.status_code == 404:
            if wants_page(request):
                return _missing_page(request.url.path)
            msg = f"no such path: {request.url.path}"
        error_type = _HTTP_ERROR_TYPES.get(error.status_code, "http_error")
        headers = dict(error.headers or {})
        if error.status_code == 405:  # Starlette names the first matching route's methods; the path has more
            headers["Allow"] = ", ".join(allowed_methods(request)) or headers.get("Allow", "")
            msg = f"{request.method} is not allowed here; allowed: {headers['Allow']}"
        return _response(error.status_code, ["path"], msg, error_type, headers or None)

    @app.exception_handler(SQLAlchemyError)
    async def database_error(request: Request, error: SQLAlchemyError) -> JSONResponse:
        if not database_unavailable(error):
            log.error("%s %s failed", request.method, request.url.path, exc_info=error)
            return _internal(error)
        request.app.state.database.failed(first_line(error))
        unavailable = database_unavailable_error(
            error, settings_of(request).retry_after_s, detail=sees_internals(request)
        )
        return JSONResponse(status_code=503, content={"detail": unavailable.errors}, headers=unavailable.headers)

    @app.exception_handler(DomainError)
    async def domain_error(request: Request, error: DomainError) -> JSONResponse:
        return _response(error.status, locate(request, error.field), error.message, error.error_type, error.headers)

    @app.exception_handler(InputError)
    async def analysis_input_error(request: Request, error: InputError) -> JSONResponse:
        return _response(422, locate(request, error.path), error.message, "value_error")

    @app.exception_handler(RequestValidationError)
    async def request_validation(_request: Request, error: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": list(item.get("loc", ())), "msg": item.get("msg", ""), "type": item.get("type", "")}
            for item in error.errors()
        ][:MAX_ERRORS]
        return JSONResponse(status_code=422, content={"detail": errors})

    @app.exception_handler(Exception)
    async def internal_error(_request: Request, error: Exception) -> JSONResponse:
        return _internal(error)  # Starlette logs the traceback after sending this


def _internal(error: BaseException) -> JSONResponse:
    return _response(500, [], f"internal error ({type(error).__name__}); the service log has the details", "internal")
