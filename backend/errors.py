"""One error shape for every 4xx, and the one place where errors become HTTP statuses.

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
HTTP layer itself (reading a body: 400, 413), which knows its status.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from bubblescope.analysis.errors import InputError

Loc = Sequence[str | int]
MAX_ERRORS = 50
_LOCATIONS = ("path", "query", "body")


class ApiError(Exception):
    """An HTTP-layer error with its status and full location (``["body"]``, ``["path", "name"]``)."""

    def __init__(self, status: int, loc: Loc, msg: str, error_type: str = "value_error") -> None:
        super().__init__(msg)
        self.status = status
        self.errors: list[dict[str, Any]] = [{"loc": list(loc), "msg": msg, "type": error_type}]


class DomainError(Exception):
    """A request a service cannot serve; ``field`` is a name or a path (``("spans", "end_ns", 17)``)."""

    status: ClassVar[int] = 422
    error_type: ClassVar[str] = "value_error"

    def __init__(self, field: str | Loc, message: str) -> None:
        super().__init__(message)
        self.field: tuple[str | int, ...] = (field,) if isinstance(field, str) else tuple(field)
        self.message = message


class NotFound(DomainError):
    status = 404
    error_type = "not_found"


class Invalid(DomainError):
    status = 422


class TooLarge(DomainError):
    status = 413
    error_type = "too_large"


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


def _response(status: int, loc: Loc, msg: str, error_type: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": [{"loc": list(loc), "msg": msg, "type": error_type}]})


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(status_code=error.status, content={"detail": error.errors})

    @app.exception_handler(DomainError)
    async def domain_error(request: Request, error: DomainError) -> JSONResponse:
        return _response(error.status, locate(request, error.field), error.message, error.error_type)

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
