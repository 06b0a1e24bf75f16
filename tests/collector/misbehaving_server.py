"""A real HTTP server on a loopback port that misbehaves on demand, or forwards to a real service.

Switch ``server.mode`` at any time; each new connection gets the current behaviour:

- ``proxy``: forward the request to ``upstream`` (a real ``bubblescope serve``) and relay the answer
- ``slow``: read the request, answer 503 only after ``slow_s`` (30 s by default)
- ``error``: 500 with a JSON error body
- ``garbage``: 200 with an HTML page (not JSON)
- ``wrong_json``: 200 with JSON that is not the service's acknowledgement
- ``drop``: read the request headers, then close the socket without an answer
- ``half``: read the request, send half an answer (headers promise more body), close
- ``refuse``: 422 naming a field, as an older service answers a field it does not know (for good: no retry helps)
- ``bad_captures``: like ``proxy``, but the ingest answers' ``captures`` are replaced by junk
  (a string, wrong types, negative steps, booleans, ...), one variant after another
"""

from __future__ import annotations

import http.client
import json
import socket
import socketserver
import threading
import urllib.parse
from collections import Counter

from tests.support import free_port

MODES = ("proxy", "slow", "error", "garbage", "wrong_json", "drop", "half", "bad_captures", "refuse")
JUNK_CAPTURES: list[object] = [
    "all of them",
    None,
    7,
    {"id": 1, "from_step": 3, "steps": 5},
    [None, "x", 3.5],
    [{"id": "1", "from_step": 3, "steps": 5}],
    [{"id": 1, "from_step": -3, "steps": 5}],
    [{"id": 1, "from_step": 3, "steps": True}],
    [{"id": 1, "from_step": 3.0, "steps": 5}],
    [{"id": 1, "from_step": 3, "steps": 0}],
    [{"from_step": 3, "steps": 5}],
    [[1, 3, 5]],
    [{"id": 1, "from_step": 2**70, "steps": 5}],
]


def _reply(status: str, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class _Handler(socketserver.StreamRequestHandler):
    server: _TcpServer

    def handle(self) -> None:
        owner = self.server.owner
        mode = owner.mode
        owner.count(mode)
        request_line = self.rfile.readline(65537).decode("latin-1").strip()
        headers: dict[str, str] = {}
        while True:
            line = self.rfile.readline(65537).decode("latin-1")
            if line in ("\r\n", "\n", ""):
                break
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if mode == "drop":
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        body = self.rfile.read(int(headers.get("content-length", "0") or 0))
        if mode in ("proxy", "bad_captures"):
            self.wfile.write(owner.forward(request_line, headers, body, mangle=mode == "bad_captures"))
        elif mode == "slow":
            if not owner.closing.wait(owner.slow_s):
                self.wfile.write(_reply("503 Service Unavailable", "text/plain", b"slow"))
        elif mode == "error":
            self.wfile.write(_reply("500 Internal Server Error", "application/json", b'{"detail":"boom"}'))
        elif mode == "garbage":
            self.wfile.write(_reply("200 OK", "text/html", b"<html><body>Welcome to nginx!</body></html>"))
        elif mode == "refuse":
            detail = b'{"detail":[{"loc":["body","steps",0,"gpu_ns"],"msg":"extra fields not permitted"}]}'
            self.wfile.write(_reply("422 Unprocessable Entity", "application/json", detail))
        elif mode == "wrong_json":
            self.wfile.write(_reply("200 OK", "application/json", b'{"status": "ok", "items": []}'))
        elif mode == "half":
            whole = _reply(
                "202 Accepted", "application/json", b'{"stored_spans": 1, "stored_steps": 1, "duplicate": false}'
            )
            self.wfile.write(whole[: len(whole) - 30])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)


class _TcpServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: MisbehavingServer


class MisbehavingServer:
    def __init__(self, mode: str, upstream: str | None = None, slow_s: float = 30.0) -> None:
        self.mode = mode
        self.upstream = upstream
        self.slow_s = slow_s
        self.requests: Counter[str] = Counter()
        self.closing = threading.Event()
        self._lock = threading.Lock()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = _TcpServer(("127.0.0.1", self.port), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __setattr__(self, name: str, value: object) -> None:
        if name == "mode" and value not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {value!r}")
        super().__setattr__(name, value)

    def start(self) -> MisbehavingServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.closing.set()  # slow answers end now instead of after slow_s
        self._server.shutdown()
        self._server.server_close()

    def count(self, mode: str) -> None:
        with self._lock:
            self.requests[mode] += 1

    def forward(self, request_line: str, headers: dict[str, str], body: bytes, mangle: bool = False) -> bytes:
        if self.upstream is None:
            return _reply("502 Bad Gateway", "text/plain", b"no upstream")
        method, path, _ = request_line.split(" ", 2)
        target = urllib.parse.urlsplit(self.upstream)
        connection = http.client.HTTPConnection(target.hostname or "127.0.0.1", target.port, timeout=60)
        try:
            keep = {k: v for k, v in headers.items() if k in ("content-type", "content-encoding", "authorization")}
            connection.request(method, path, body=body, headers=keep)
            answer = connection.getresponse()
            payload = answer.read()
            if mangle and path.endswith("/ingest") and answer.status == 202:
                payload = self._junk_captures(payload)
            status = f"{answer.status} {answer.reason}"
            return _reply(status, answer.getheader("content-type", "application/json"), payload)
        finally:
            connection.close()

    def _junk_captures(self, payload: bytes) -> bytes:
        document = json.loads(payload)
        with self._lock:
            document["captures"] = JUNK_CAPTURES[self.requests["junk"] % len(JUNK_CAPTURES)]
            self.requests["junk"] += 1
        return json.dumps(document).encode()
