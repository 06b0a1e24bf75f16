"""A webhook receiver for tests: a real HTTP server on a free loopback port that records every POST
and answers each with the next status of its script (200 once the script is used up), or, when it
``hangs``, answers none until it stops (a target that accepts a request and never answers)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support import free_port

HANG_AT_MOST_S = 120


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class WebhookReceiver:
    def __init__(
        self, statuses: Sequence[int] = (), port: int | None = None, path: str | None = None, hangs: bool = False
    ) -> None:
        self.port = port or free_port()
        self.path = path or unique_path()  # so no other test's outbox row targets this receiver
        self.statuses = list(statuses)
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.hangs = hangs
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    receiver.received.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                if receiver.hangs:
                    receiver._stopping.wait(HANG_AT_MOST_S)
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *_args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, name="test-webhook-receiver", daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def requests(self) -> list[Received]:
        with self._lock:
            return list(self.received)

    def wait_for(self, count: int, timeout_s: float = 30) -> list[Received]:
        """The first ``count`` requests; AssertionError with what came if fewer came in ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while len(self.requests()) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(self.requests())} of {count} webhook requests after {timeout_s}s")
            time.sleep(0.05)
        return self.requests()[:count]


def unique_path() -> str:
    return f"/hook/{uuid.uuid4().hex[:12]}"


@contextmanager
def webhook_receiver(
    statuses: Sequence[int] = (), port: int | None = None, path: str | None = None, hangs: bool = False
) -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver(statuses, port, path, hangs)
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.stop()
