"""HTTP delivery with the standard library: one request, a timeout, and a verdict; never raises.

A 2xx only counts as delivered when the body is the service's JSON acknowledgement (an ingest
result, a run or a rank). Anything else (an HTML page from a proxy, a truncated body, some other
program on the port) means the data may not be stored, so the message is kept and retried.
"""

from __future__ import annotations

import enum
import http.client
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, BinaryIO

_MAX_BODY_BYTES = 1 << 20


class Verdict(enum.Enum):
    DELIVERED = "delivered"  # 2xx with the service's acknowledgement: stored (or already stored)
    RETRY = "retry"  # down, slow, 5xx, 408/429, dropped connection, not our service: try again later
    REJECTED = "rejected"  # other 4xx: the server will never take this message
    UNAUTHORIZED = "unauthorized"  # 401/403: the token is missing, wrong, revoked or lacks a scope: keep it
    MISADDRESSED = "misaddressed"  # 404/405, no such route: the URL points past or beside the API: keep it


@dataclass(frozen=True)
class Response:
    verdict: Verdict
    status: int | None
    body: bytes
    error: str | None = None
    document: dict[str, Any] | None = None  # the parsed acknowledgement when delivered
    retry_after_s: float | None = None  # a busy or unavailable service's Retry-After, in seconds


@dataclass(frozen=True)
class Message:
    """One request to the service: registration (PUT) or a span batch (POST)."""

    method: str
    path: str
    body: bytes  # gzip-compressed JSON
    span_count: int = 0  # spans inside: counted as dropped if the message is lost


def acknowledgement_fields(message: Message) -> tuple[str, ...]:
    """Keys the service's 2xx answer to ``message`` always has (IngestResult, RankOut, RunSummary, a profile's
    trace stored)."""
    if "/profiles/" in message.path:
        return ("run_key", "rank")
    if message.method == "POST" and message.path.endswith("/ingest"):
        return ("stored_spans", "duplicate")
    if "/ranks/" in message.path:
        return ("rank",)
    return ("key",)


def _acknowledgement(message: Message, body: bytes) -> dict[str, Any] | None:
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(document, dict):
        return None
    if any(field not in document for field in acknowledgement_fields(message)):
        return None
    return document


MAX_RETRY_AFTER_S = 300.0
ROUTE_MISSES = {404: ("Not Found", "not_found"), 405: ("Method Not Allowed", "method_not_allowed")}
"""How a server says it has no route for a path (or none taking the method): a plain web server's words, and the
service's error type on the ``path`` itself (a run or rank it does not know is another location)."""


def no_such_route(status: int, body: bytes) -> bool:
    """Whether a 404/405 answer says the path itself is unknown: the URL points beside the API."""
    words, error_type = ROUTE_MISSES.get(status, (None, None))
    if words is None:
        return False
    try:
        detail = json.loads(body).get("detail")
    except (ValueError, AttributeError):
        return False
    if detail == words:
        return True
    first = detail[0] if isinstance(detail, list) and detail else None
    return isinstance(first, dict) and first.get("loc") == ["path"] and first.get("type") == error_type


def readable(body: bytes, limit: int = 300) -> str:
    """A service's answer as one line of text: its JSON ``detail`` where it has one, else the body decoded."""
    text = body.decode("utf-8", errors="replace")
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    if isinstance(document, dict) and "detail" in document:
        detail = document["detail"]
        if isinstance(detail, list):  # the service's errors: [{"loc": [...], "msg": "...", "type": "..."}]
            detail = "; ".join(
                f"{'.'.join(str(part) for part in item.get('loc', []))}: {item.get('msg')}"
                if isinstance(item, dict)
                else str(item)
                for item in detail
            )
        text = detail if isinstance(detail, str) else json.dumps(detail, ensure_ascii=False)
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _retry_after(header: str | None) -> float | None:
    """Retry-After in seconds (the delay form; an HTTP date is ignored), at most five minutes."""
    try:
        seconds = float(header) if header is not None else None
    except ValueError:
        return None
    if seconds is None or not seconds >= 0:
        return None
    return min(seconds, MAX_RETRY_AFTER_S)


def send(
    base_url: str, message: Message, token: str | None, timeout_s: float, file: tuple[BinaryIO, int] | None = None
) -> Response:
    """Send one message; classify the outcome instead of raising. ``file`` (an open gzip file and its size) is sent
    as the body in place of the message's, read as it goes out."""
    request = urllib.request.Request(
        base_url.rstrip("/") + message.path,
        data=message.body if file is None else file[0],
        method=message.method,
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    if file is not None:
        request.add_header("Content-Length", str(file[1]))
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            status, body = reply.status, reply.read(_MAX_BODY_BYTES)
    except urllib.error.HTTPError as error:
        status = error.code
        retry = status >= 500 or status in (408, 425, 429)
        verdict = Verdict.RETRY if retry else Verdict.UNAUTHORIZED if status in (401, 403) else Verdict.REJECTED
        body = b""
        try:
            body = error.read(1 << 16)
        except Exception:  # noqa: BLE001 - a broken error body changes nothing
            pass
        if no_such_route(status, body):
            verdict = Verdict.MISADDRESSED
        wait = _retry_after(error.headers.get("Retry-After") if error.headers is not None else None)
        return Response(verdict, status, body, str(error), retry_after_s=wait)
    except (TimeoutError, OSError, http.client.HTTPException, ValueError) as error:
        return Response(Verdict.RETRY, None, b"", f"{type(error).__name__}: {error}")
    except Exception as error:  # noqa: BLE001 - whatever the peer does, the caller gets a verdict
        return Response(Verdict.RETRY, None, b"", f"unexpected {type(error).__name__}: {error}")
    document = _acknowledgement(message, body)
    if document is None:
        return Response(Verdict.RETRY, status, body[:500], f"HTTP {status} without a bubblescope acknowledgement")
    return Response(Verdict.DELIVERED, status, body, None, document)
