"""One error shape for every 4xx: ``{"detail": [{"loc": [...], "msg": "...", "type": "..."}]}``.

It is FastAPI's own validation shape, so clients parse request-validation errors and ours alike;
``loc`` names the field (``["body", "spans", "end_ns", 17]``), ``msg`` says what is wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

Loc = Sequence[str | int]


class ApiError(Exception):
    def __init__(self, status: int, loc: Loc, msg: str, error_type: str = "value_error") -> None:
        super().__init__(msg)
        self.status = status
        self.errors: list[dict[str, Any]] = [{"loc": list(loc), "msg": msg, "type": error_type}]


def from_validation_error(error: ValidationError, prefix: Loc = ("body",)) -> ApiError:
    """Turn a pydantic error into a 422 ApiError whose locations start at ``prefix``."""
    api_error = ApiError(422, prefix, "invalid request")
    api_error.errors = [
        {"loc": [*prefix, *item["loc"]], "msg": item["msg"], "type": item["type"]}
        for item in error.errors(include_url=False, include_context=False, include_input=False)
    ][:50]
    return api_error


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(status_code=error.status, content={"detail": error.errors})

    @app.exception_handler(RequestValidationError)
    async def request_validation(_request: Request, error: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": list(item.get("loc", ())), "msg": item.get("msg", ""), "type": item.get("type", "")}
            for item in error.errors()
        ][:50]
        return JSONResponse(status_code=422, content={"detail": errors})
