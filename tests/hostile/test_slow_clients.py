"""Clients that stall, vanish or send a wall of errors: each gets a bounded answer in the error shape,
holds no limit for long, and leaves no traceback. Real uvicorn process on SQLite."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bubblescope.backend.db import migrate
from tests.support import LiveServer, assert_names, ingest_batch, post_gzip, register, start_server

BODY_TIMEOUT_S = 1


@pytest.fixture(scope="module")
def impatient_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder = tmp_path_factory.mktemp("impatient")
    url = f"sqlite:///{folder / 'bubblescope.db'}"
    migrate.upgrade(url)
    live = start_server(url, folder, extra_args=["--body-timeout", str(BODY_TIMEOUT_S), "--ingest-in-flight", "2"])
    yield live
    live.stop()


def _stalled_upload(live: LiveServer, sent: bytes, declared: int) -> socket.socket:
    host, port = httpx.URL(live.url).host, httpx.URL(live.url).port
    connection = socket.create_connection((host, port))
    head = (
        f"POST /api/v1/ingest HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {declared}\r\n\r\n"
    )
    connection.sendall(head.encode() + sent)
    return connection


def _answer(connection: socket.socket, timeout_s: float) -> bytes:
    connection.settimeout(timeout_s)
    received = b""
    while b"\r\n\r\n" not in received or not received.rstrip().endswith(b"}"):
        chunk = connection.recv(65536)
        if not chunk:
            break
        received += chunk
    return received


def test_a_stalled_upload_gets_408_and_frees_its_ingest_slot(impatient_server: LiveServer) -> None:
    stalled = [_stalled_upload(impatient_server, b'{"run_key": ', 10_000) for _ in range(2)]  # both slots
    try:
        for connection in stalled:
            answer = _answer(connection, 30)
            assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
            assert b'"type":"timeout"' in answer and b'"loc":["body"]' in answer, answer
    finally:
        for connection in stalled:
            connection.close()
    with impatient_server.client() as client:
        key = register(client, world_size=1)
        assert post_gzip(client, ingest_batch(key)).status_code == 202  # the slots were given back


def test_slow_uploads_hold_no_ingest_slot(tmp_path: Path) -> None:
    """The probe's finding: bodies sent a byte at a time took every ingest slot, so everyone else's batches got
    503 until the body timeout. Now a slot is taken once a body has arrived: six stalled senders against one slot
    and one queue place, and another client's batch is still stored at once (it used to get 503)."""
    url = f"sqlite:///{tmp_path / 'bubblescope.db'}"
    migrate.upgrade(url)
    extra = ["--body-timeout", "8", "--ingest-in-flight", "1", "--ingest-queue", "1"]
    live = start_server(url, tmp_path, extra_args=extra)
    stalled: list[socket.socket] = []
    try:
        with live.client() as client:
            key = register(client, world_size=1)
            stalled = [_stalled_upload(live, b'{"run_key": ', 10_000) for _ in range(6)]
            time.sleep(0.5)  # each is mid-body on the server
            started = time.monotonic()
            stored = post_gzip(client, ingest_batch(key))
            waited = time.monotonic() - started
            assert stored.status_code == 202, stored.text
            assert waited < 8, f"{waited:.1f} s"  # before any stalled body timed out: it did not wait for them
        for connection in stalled:
            assert _answer(connection, 30).startswith(b"HTTP/1.1 408")
    finally:
        for connection in stalled:
            connection.close()
        live.stop()


def test_headers_sent_a_byte_at_a_time_lose_their_connection(tmp_path: Path) -> None:
    """uvicorn has no header timeout: a request's headers trickled in held a connection for good. Now the
    connection is closed --header-timeout after it opened (or after a next request's first byte) while its
    headers are incomplete; a kept-alive connection still serves request after request."""
    url = f"sqlite:///{tmp_path / 'bubblescope.db'}"
    migrate.upgrade(url)
    live = start_server(url, tmp_path, extra_args=["--header-timeout", "1"])
    try:
        host, port = httpx.URL(live.url).host, httpx.URL(live.url).port
        with socket.create_connection((host, port)) as trickle:
            trickle.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never the blank line
            started = time.monotonic()
            trickle.settimeout(30)
            for _ in range(5):  # a header line a little at a time, as a slow sender does
                time.sleep(0.3)
                try:
                    trickle.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    break
            closed = trickle.recv(1024) == b""
            waited = time.monotonic() - started
        assert closed and waited < 20, f"closed {closed} after {waited:.1f} s"
        with live.client() as client:  # one connection, kept alive across requests and a pause
            assert client.get("/api/v1/health").status_code == 200
            time.sleep(1.5)  # longer than the header timeout, between requests (the keep-alive timer's time)
            assert client.get("/api/v1/health").status_code == 200
            assert client.get("/api/v1/health").status_code == 200
    finally:
        live.stop()


def test_a_client_that_goes_away_mid_body_leaves_no_traceback(impatient_server: LiveServer) -> None:
    for _ in range(3):
        _stalled_upload(impatient_server, b'{"run_key": "x", ', 10_000).close()
    time.sleep(0.5)
    with impatient_server.client() as client:
        assert client.get("/api/v1/health").status_code == 200
    log = impatient_server.log_path.read_text()
    assert "Traceback" not in log and "ClientDisconnect" not in log, log[-2000:]


def test_a_wall_of_bad_entries_is_one_error_per_column(impatient_server: LiveServer) -> None:
    """100,000 bad entries in each of eight columns: one error per column, not 800,000 (pydantic would
    build every one before the answer kept 50: seconds and a gigabyte)."""
    columns = ("step", "kind", "start_ns", "end_ns", "stage", "microbatch", "peer", "bytes")
    document = {"run_key": "x", "rank": 0, "seq": 0, "spans": {column: ["bad"] * 100_000 for column in columns}}
    with impatient_server.client() as client:
        started = time.monotonic()
        response = post_gzip(client, document)
        seconds = time.monotonic() - started
    assert_names(response, 422, ["body", "spans", "step", 0], "")
    assert len(response.json()["detail"]) == len(columns), response.json()["detail"][:3]
    assert seconds < 30, f"{seconds:.1f} s"  # a hang guard; it takes well under a second


def test_a_body_budget_below_the_body_limit_is_refused_at_start(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bubblescope.cli",
            "serve",
            "--db",
            str(tmp_path / "x.db"),
            "--max-bodies-bytes",
            "1000",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "--max-bodies-bytes (1000) must be at least" in done.stderr, done.stderr
