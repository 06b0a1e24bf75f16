"""HTTP delivery with the standard library: one request, a timeout, and a verdict; never raises."""

from __future__ import annotations

import enum
import http.client
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass


class Verdict(enum.Enum):
    DELIVERED = "delivered"  # 2xx: stored (or already stored: idempotent retry)
    RETRY = "retry"  # server down, slow, 5xx, 408/429, dropped connection: try again later
    REJECTED = "rejected"  # other 4xx: the server will never take this message


@dataclass(frozen=True)
class Response:
    verdict: Verdict
    status: int | None
    body: bytes
    error: str | None = None


@dataclass(frozen=True)
class Message:
    """One request to the service: registration (PUT) or a span batch (POST)."""

    method: str
    path: str
    body: bytes  # gzip-compressed JSON


def send(base_url: str, message: Message, token: str | None, timeout_s: float) -> Response:
    """Send one message; classify the outcome instead of raising."""
    request = urllib.request.Request(
        base_url.rstrip("/") + message.path,
        data=message.body,
        method=message.method,
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return Response(Verdict.DELIVERED, reply.status, reply.read(1 << 20))
    except urllib.error.HTTPError as error:
        status = error.code
        retry = status >= 500 or status in (408, 425, 429)
        body = b""
        try:
            body = error.read(1 << 16)
        except Exception:  # noqa: BLE001 - a broken error body changes nothing
            pass
        return Response(Verdict.RETRY if retry else Verdict.REJECTED, status, body, str(error))
    except (OSError, http.client.HTTPException, socket.timeout, ValueError) as error:
        return Response(Verdict.RETRY, None, b"", f"{type(error).__name__}: {error}")
