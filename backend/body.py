"""Reading a JSON request body (gzip allowed) with every limit enforced before the work it bounds.

In order, each refusal a 4xx naming the field (docs/limits.md):

1. ``Content-Type`` must be JSON (415): a page on another site can send a "simple" ``text/plain``
   POST without asking the service first; a JSON one it cannot.
2. The body on the wire is read chunk by chunk up to ``BodyLimit.wire_bytes`` (413), and gunzipped
   as it arrives, never past ``BodyLimit.json_bytes`` (413): a 250 MiB bomb in 250 KiB is refused
   after 32 MiB of output, not inflated.
   Its values are counted as the bytes arrive (a comma or an opening bracket each), and refused
   past ``BodyLimit.json_values`` (413): what parsing would allocate is bounded before it starts.
   Across all requests, at most ``--max-bodies-bytes`` of bodies are held at once (503, busy). The
   whole body must arrive within ``--body-timeout`` (408); a client gone mid-body is a 400.
3. In a worker thread, not on the event loop, two documents at a time (the wait for a turn is on
   the event loop, so it holds no worker thread): strict UTF-8 (400), then
   ``json.loads`` (400, and 400 for nesting deeper than the interpreter's recursion limit; a number without
   a fractional part, ``5.0``, read as the integer it is; where the endpoint asks, as ``/plan`` does, 422 for an
   object that names a key twice), then no
   NUL character and no unpaired surrogate in any string or key (422 naming where: PostgreSQL
   cannot store either).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import weakref
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import anyio
from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from bubblescope.analysis import DuplicateKeyError, refuse_repeated_keys, unique_json_object
from bubblescope.backend.errors import ApiError, Loc, busy, from_validation_error
from bubblescope.backend.settings import SMALL_BODY_BYTES, MiB, ServiceSettings, settings_of

ModelT = TypeVar("ModelT", bound=BaseModel)

JSON_MEDIA_TYPES = ("application/json",)
_BAD_ESCAPE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")
_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")


@dataclass(frozen=True)
class BodyLimit:
    """How much one endpoint reads: bytes on the wire, bytes once gunzipped, JSON values."""

    wire_bytes: int
    json_bytes: int
    json_values: int

    @classmethod
    def for_ingest(cls, settings: ServiceSettings) -> BodyLimit:
        return cls(settings.max_body_bytes, settings.max_json_bytes, settings.max_json_values)


SMALL_BODY = BodyLimit(wire_bytes=SMALL_BODY_BYTES, json_bytes=SMALL_BODY_BYTES, json_values=100_000)
"""Every body but an ingest batch: a registration, a rank's end, a capture or plan request."""


BODY_MODELS: dict[str, type[BaseModel]] = {}
"""The models of the bodies endpoints read themselves, by name: ``backend/openapi.py`` puts their
schemas in the OpenAPI document's components."""

BODY_NOTE = (
    "A JSON document (`Content-Type: application/json`), sent as is or gzip-compressed with "
    "`Content-Encoding: gzip`; limits in docs/limits.md."
)


def json_body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` documenting a body that the endpoint reads itself (gzip allowed)."""
    known = BODY_MODELS.setdefault(model.__name__, model)
    if known is not model:
        raise TypeError(f"two body models are named {model.__name__}: {known!r} and {model!r}")
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {
        "requestBody": {"required": True, "description": BODY_NOTE, "content": {"application/json": {"schema": schema}}}
    }


async def read_json(request: Request, limit: BodyLimit = SMALL_BODY, unique_keys: bool = False) -> Any:
    """The request's JSON document, refused as the module docstring says; with ``unique_keys`` also where an object
    names a key twice (422)."""
    _require_json(request)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit.wire_bytes:
        raise _too_large(f"payload of {declared} bytes exceeds the limit of {limit.wire_bytes}")
    gzipped = request.headers.get("content-encoding", "identity").strip().lower()
    if gzipped not in ("identity", "gzip"):
        raise ApiError(
            415, ["header", "content-encoding"], f"{gzipped!r} is not accepted; send gzip or nothing", "unsupported"
        )
    inflate = _Inflater(limit.json_bytes) if gzipped == "gzip" else None
    budget: BodyBudget = request.app.state.body_budget
    timeout_s = settings_of(request).body_timeout_s
    parts: list[bytes] = []
    wire = size = values = 0
    try:
        with anyio.fail_after(timeout_s):
            async for chunk in received_chunks(request):
                wire += len(chunk)
                if wire > limit.wire_bytes:
                    raise _too_large(f"payload exceeds the limit of {limit.wire_bytes} bytes")
                for piece in inflate.pieces(chunk) if inflate is not None else (chunk,):
                    budget.reserve(len(piece))
                    size += len(piece)
                    parts.append(piece)
                    if inflate is None and size > limit.json_bytes:
                        raise _too_large(f"JSON document exceeds the limit of {limit.json_bytes} bytes")
                    values += piece.count(b",") + piece.count(b"[") + piece.count(b"{")
                    if values > limit.json_values:
                        raise _too_large(f"more than {limit.json_values} JSON values (the limit)")
        if inflate is not None:
            inflate.finish()
        raw = b"".join(parts)
        parts.clear()
        async with _parse_slots():  # waited for on the event loop, not in a worker thread
            return await run_in_threadpool(decode_json, raw, unique_keys)
    except TimeoutError:
        raise ApiError(408, ["body"], f"the body did not arrive within {timeout_s:g} s", "timeout") from None
    finally:
        budget.release(size)


async def received_chunks(request: Request) -> AsyncIterator[bytes]:
    try:
        async for chunk in request.stream():
            yield chunk
    except ClientDisconnect:
        raise ApiError(400, ["body"], "the client went away before sending the whole body", "disconnected") from None


class BodyBudget:
    """Bytes of request bodies held across all requests at once (used on the event loop only).

    Each request's limits bound it alone; this bounds them together, so that many requests, each
    within its limits, cannot add up to gigabytes: past ``limit``, 503 with Retry-After."""

    def __init__(self, limit: int, retry_after_s: int) -> None:
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.held = 0

    def reserve(self, size: int) -> None:
        if self.held + size > self.limit:
            raise busy(
                f"{self.held} bytes of request bodies are being read (the limit is {self.limit})", self.retry_after_s
            )
        self.held += size

    def release(self, size: int) -> None:
        self.held -= size


def _require_json(request: Request) -> None:
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type not in JSON_MEDIA_TYPES:
        shown = media_type or "none"
        raise ApiError(
            415, ["header", "content-type"], f"{shown!r} is not accepted; send application/json", "unsupported"
        )


FILE_MEDIA_TYPES: Final = ("application/json", "application/octet-stream", "application/gzip", "application/x-gzip")
"""What a file upload is sent as. None of them may another site's page send without asking first (CORS: only
``text/plain`` and form types, or no type at all, go without a preflight), so a page cannot upload to a service on
this machine that runs without ``--auth``."""


def require_file_type(request: Request) -> None:
    """415 naming the content type of a file upload that is not one of ``FILE_MEDIA_TYPES``, or has none."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type not in FILE_MEDIA_TYPES:
        raise ApiError(
            415,
            ["header", "content-type"],
            f"{media_type or 'none'!r} is not accepted for a file; send application/octet-stream (or application/json, "
            "application/gzip)",
            "unsupported",
        )


def _too_large(message: str) -> ApiError:
    return ApiError(413, ["body"], message, "too_large")


class _Inflater:
    """Gunzip chunk by chunk in pieces of at most ``PIECE`` bytes, never more than ``cap`` in all."""

    PIECE = 1 * MiB

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.produced = 0
        self._decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)

    def pieces(self, chunk: bytes) -> Iterator[bytes]:
        data = chunk
        while data:
            try:
                piece = self._decompressor.decompress(data, self.PIECE)
            except zlib.error as error:
                raise _gzip_invalid(str(error)) from None
            if self._decompressor.unused_data:
                raise _gzip_invalid("data after the end of the gzip stream")
            self.produced += len(piece)
            if self.produced > self.cap:
                raise _too_large(f"decompressed payload exceeds the limit of {self.cap} bytes")
            yield piece
            data = self._decompressor.unconsumed_tail

    def finish(self) -> None:
        if not self._decompressor.eof:
            raise _gzip_invalid("truncated")


def _gzip_invalid(why: str) -> ApiError:
    return ApiError(400, ["body"], f"body is not valid gzip: {why}", "gzip_invalid")


PARSED_AT_ONCE = 2
"""Documents parsed at once: parsing holds the interpreter's lock anyway, so more would only add
their memory together (and waiting requests would hold worker threads)."""
_PARSE_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _parse_slots() -> asyncio.Semaphore:
    """This event loop's semaphore (a semaphore belongs to one loop; tests run several)."""
    return _PARSE_SLOTS.setdefault(asyncio.get_running_loop(), asyncio.Semaphore(PARSED_AT_ONCE))


def decode_json(raw: bytes, unique_keys: bool = False) -> Any:
    """Parse ``raw`` (runs in a worker thread); see the module docstring. ``unique_keys``: an object naming a key
    twice is refused (422 naming the key) instead of keeping its last value, as a plan's request is."""
    if not raw.strip():
        raise ApiError(400, ["body"], "empty body; expected a JSON object", "json_invalid")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ApiError(400, ["body"], f"body is not valid UTF-8: {error}", "json_invalid") from None
    hook = unique_json_object if unique_keys else None
    try:
        document = json.loads(text, parse_constant=_not_json, parse_float=_finite, object_pairs_hook=hook)
        if unique_keys:
            refuse_repeated_keys(document)
    except DuplicateKeyError as error:
        where = ["body", *error.path, error.key]
        raise ApiError(422, where, "given twice in one object; give it once", "value_error") from None
    except RecursionError:
        raise ApiError(400, ["body"], "JSON nested too deeply", "json_invalid") from None
    except ValueError as error:
        raise ApiError(400, ["body"], f"malformed JSON: {error}", "json_invalid") from None
    if _BAD_ESCAPE.search(raw):  # only then can a decoded string hold either
        _refuse_bad_text(document)
    return document


def _not_json(name: str) -> float:
    raise ApiError(400, ["body"], f"{name} is not a JSON number", "json_invalid")


def _finite(text: str) -> float | int:
    """A JSON number written with a fraction or an exponent: refused past a double; ``5.0`` or ``5e3`` is an
    integer, as JSON Schema (and so the OpenAPI document) counts them, so a strict integer field takes it."""
    value = float(text)
    if not math.isfinite(value):
        raise ApiError(400, ["body"], f"{text} is beyond the largest number a double holds", "json_invalid")
    # past 2^53 a double no longer holds every integer: 123456789012345678.0 may not be the number written
    return int(value) if value.is_integer() and abs(value) <= 2**53 else value


def _refuse_bad_text(document: Any) -> None:
    for loc, text in _strings(document, ()):
        found = _BAD_TEXT.search(text)
        if found is None:
            continue
        what = "a NUL character" if found.group() == "\x00" else "an unpaired surrogate"
        raise ApiError(422, ["body", *loc], f"text holds {what} (\\u{ord(found.group()):04x})", "string_invalid")


def _strings(value: Any, loc: Loc) -> Iterator[tuple[Loc, str]]:
    """Every string and key in a parsed document with its location, without recursion."""
    stack: list[tuple[Loc, Any]] = [(loc, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            yield where, item
        elif isinstance(item, dict):
            for key, child in item.items():
                yield (*where, key), key
                stack.append(((*where, key), child))
        elif isinstance(item, list):
            stack.extend(((*where, index), child) for index, child in enumerate(item))


def parse_document(model: type[ModelT], document: Any, check: Callable[[Any], None] | None = None) -> ModelT:
    """Validate a parsed JSON document; a 422 naming each bad field under ``body``.

    ``check``, when given, runs on the raw document first (bounds to enforce before validation)."""
    if check is not None:
        check(document)
    try:
        return model.model_validate(document)
    except ValidationError as error:
        raise from_validation_error(error) from None
