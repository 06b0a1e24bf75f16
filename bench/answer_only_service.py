"""A stand-in for a service on another machine: it reads each request and answers the
acknowledgement the collector expects (``collector.transport.acknowledgement_fields``), and does
nothing else, so the service's own work leaves the benchmarked job's cores while the collector
still does all of its own (aggregates, encoding, HTTP).

    python bench/answer_only_service.py PORT
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import LiveServer, free_port


class AnswerOnly(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.endswith("/ingest"):
            document: dict[str, object] = {"stored_spans": 0, "duplicate": False, "captures": []}
        elif "/ranks/" in self.path:
            document = {"rank": 0}
        else:
            document = {"key": self.path.rstrip("/").rsplit("/", 1)[-1]}
        body = json.dumps(document).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = answer

    def log_message(self, format: str, *args: object) -> None:
        pass


def start_answer_only(log_dir: Path) -> LiveServer:
    """Start the stand-in on a free loopback port; returns once it answers."""
    port = free_port()
    log_path = log_dir / f"answer-only-{port}.log"
    process = subprocess.Popen(
        [sys.executable, __file__, str(port)],
        stdout=open(log_path, "wb"),  # noqa: SIM115 (the child keeps it), stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        try:
            httpx.get(f"{url}/api/v1/health", timeout=1)
            return LiveServer(url, "", process, log_path)
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"answer-only service did not start: {log_path.read_text()}")


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), AnswerOnly).serve_forever()
