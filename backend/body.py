"""Reading a JSON request body that may be gzip-compressed, with hard size limits."""

from __future__ import annotations

import json
import zlib
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from bubblescope.backend.errors import ApiError, from_validation_error

ModelT = TypeVar("ModelT", bound=BaseModel)

MAX_WIRE_BYTES = 32 * 1024 * 1024
MAX_JSON_BYTES = 256 * 1024 * 1024


def json_body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` documenting a body that the endpoint reads itself (gzip allowed)."""
    return {"requestBody": {"content": {"application/json": {"schema": model.model_json_schema()}}}}


async def read_json(request: Request) -> Any:
    """The request's JSON document; 413 past the size limits, 400 for bad gzip or JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_WIRE_BYTES:
        raise ApiError(413, ["body"], f"payload of {declared} bytes exceeds the limit of {MAX_WIRE_BYTES}", "too_large")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_WIRE_BYTES:
            raise ApiError(413, ["body"], f"payload exceeds the limit of {MAX_WIRE_BYTES} bytes", "too_large")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if request.headers.get("content-encoding", "").lower() == "gzip":
        raw = _gunzip(raw)
    if not raw:
        raise ApiError(400, ["body"], "empty body; expected a JSON object", "json_invalid")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise ApiError(400, ["body"], f"malformed JSON: {error}", "json_invalid") from None


def _gunzip(raw: bytes) -> bytes:
    decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        data = decompressor.decompress(raw, MAX_JSON_BYTES)
    except zlib.error as error:
        raise ApiError(400, ["body"], f"body is not valid gzip: {error}", "gzip_invalid") from None
    if decompressor.unconsumed_tail:
        raise ApiError(413, ["body"], f"decompressed payload exceeds the limit of {MAX_JSON_BYTES} bytes", "too_large")
    if not decompressor.eof:
        raise ApiError(400, ["body"], "body is truncated gzip", "gzip_invalid")
    return data


def parse_document(model: type[ModelT], document: Any) -> ModelT:
    """Validate a parsed JSON document; a 422 naming each bad field under ``body``."""
    try:
        return model.model_validate(document)
    except ValidationError as error:
        raise from_validation_error(error) from None
