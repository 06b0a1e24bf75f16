"""The service's policies against a hostile web and a misbehaving client, on a real server (SQLite):
JSON-only writes (no cross-site "simple" POST), CORS off by default, the Host allowlist (DNS
rebinding), capture requests de-duplicated and rate-limited per run, one error shape for every
status, liveness and readiness, and a one-line refusal to start on a database it cannot use."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

from bubblescope.backend.db import migrate
from tests.support import LiveServer, assert_names, count_rows, free_port, post_gzip, register, start_server

BASE_NS = 1_700_000_000_000_000_000
EVIL = "https://evil.example"
OK_ORIGIN = "https://ok.example"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LiveServer]]:
    """Servers started with serve options, each on its own SQLite file, started side by side.

    ``open``: a CORS origin and 3 capture requests per run and hour; ``named``: a Host allowlist
    (127.0.0.1 stays on it: ``start_server`` polls /health by that name); ``all_interfaces``: bound
    to 0.0.0.0 with no allowlist."""
    options = {
        "open": ["--cors-origin", OK_ORIGIN, "--captures-per-hour", "3"],
        "named": ["--allowed-host", "127.0.0.1", "--allowed-host", "bubblescope.internal"],
        "all_interfaces": ["--host", "0.0.0.0", "--insecure"],
    }

    folders = {name: tmp_path_factory.mktemp(f"policies-{name}") for name in options}
    for folder in folders.values():  # one at a time: Alembic's operations are not thread-safe
        migrate.upgrade(f"sqlite:///{folder / 'bubblescope.db'}")

    def start(name: str) -> LiveServer:
        return start_server(f"sqlite:///{folders[name] / 'bubblescope.db'}", folders[name], extra_args=options[name])

    with ThreadPoolExecutor(len(options)) as pool:
        started = dict(zip(options, pool.map(start, options)))
    yield started
    for live in started.values():
        live.stop()


def steps_batch(key: str, seq: int, steps: range) -> dict[str, Any]:
    """Step aggregates only, no spans (what the collector sends for unsampled steps)."""
    aggregates = [
        {
            "step": step,
            "start_ns": BASE_NS + step * 1_000_000,
            "end_ns": BASE_NS + step * 1_000_000 + 900_000,
            "compute_ns": 900_000,
            "comm_ns": 0,
            "exposed_comm_ns": 0,
            "idle_ns": 0,
            "span_count": 0,
        }
        for step in steps
    ]
    empty: dict[str, list[Any]] = {"step": [], "kind": [], "start_ns": [], "end_ns": []}
    return {"run_key": key, "rank": 0, "seq": seq, "steps": aggregates, "spans": empty}


def ingest(client: httpx.Client, key: str, seq: int, steps: range) -> list[dict[str, Any]]:
    """The batch's answer's capture requests."""
    response = post_gzip(client, steps_batch(key, seq, steps))
    assert response.status_code == 202, response.text
    captures: list[dict[str, Any]] = response.json()["captures"]
    return captures


def assert_error_shape(response: httpx.Response, status: int) -> list[dict[str, Any]]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    document = response.json()
    assert list(document) == ["detail"] and document["detail"], document
    for item in document["detail"]:
        assert sorted(item) == ["loc", "msg", "type"], item
        assert isinstance(item["loc"], list) and isinstance(item["msg"], str) and item["msg"], item
        assert isinstance(item["type"], str) and item["type"], item
    detail: list[dict[str, Any]] = document["detail"]
    return detail


# --- writes must be JSON: a page on another site cannot send a "simple" cross-site POST --------

SIMPLE_BODIES = [
    pytest.param({"Content-Type": "text/plain"}, id="text-plain"),
    pytest.param({"Content-Type": "text/plain;charset=UTF-8"}, id="text-plain-charset"),
    pytest.param({"Content-Type": "application/x-www-form-urlencoded"}, id="form"),
    pytest.param({"Content-Type": "multipart/form-data; boundary=x"}, id="multipart"),
    pytest.param({}, id="no-content-type"),
]


@pytest.mark.parametrize("headers", SIMPLE_BODIES)
def test_a_write_that_is_not_json_is_refused_and_nothing_stored(
    sqlite_server: LiveServer, headers: dict[str, str]
) -> None:
    with sqlite_server.client() as client:
        key = register(client, world_size=1)
        writes = [
            ("/api/v1/ingest", steps_batch(key, 0, range(3))),
            (f"/api/v1/runs/{key}/capture", {"steps": 2}),
        ]
        for url, document in writes:
            response = client.post(url, content=json.dumps(document).encode(), headers=headers)
            assert_names(response, 415, ["header", "content-type"], "send application/json")
            assert_error_shape(response, 415)
        fresh = f"hostile-{uuid.uuid4().hex[:10]}"
        registration = json.dumps({"name": "cross-site", "world_size": 1}).encode()
        assert client.put(f"/api/v1/runs/{fresh}", content=registration, headers=headers).status_code == 415
        assert client.get(f"/api/v1/runs/{fresh}").status_code == 404
    for table in ("steps", "ingested_batches", "capture_requests"):
        assert count_rows(sqlite_server.db_url, table, key) == 0, table


def test_json_with_a_charset_is_accepted(sqlite_server: LiveServer) -> None:
    headers = {"Content-Type": "application/json; charset=utf-8"}
    with sqlite_server.client() as client:
        key = register(client, world_size=1)
        batch = json.dumps(steps_batch(key, 0, range(3))).encode()
        assert client.post("/api/v1/ingest", content=batch, headers=headers).status_code == 202
        capture = client.post(f"/api/v1/runs/{key}/capture", content=b'{"steps": 2}', headers=headers)
        assert capture.status_code == 201, capture.text
    assert count_rows(sqlite_server.db_url, "steps", key) == 3


# --- CORS ----------------------------------------------------------------------------------------


def preflight(client: httpx.Client, origin: str, url: str = "/api/v1/ingest") -> httpx.Response:
    return client.options(
        url,
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
    )


def test_no_origin_may_call_the_api_by_default(sqlite_server: LiveServer) -> None:
    with sqlite_server.client() as client:
        for origin in (EVIL, OK_ORIGIN, "null"):
            answer = preflight(client, origin)
            assert "access-control-allow-origin" not in answer.headers, answer.headers
            read = client.get("/api/v1/runs", headers={"Origin": origin})
            assert read.status_code == 200
            assert "access-control-allow-origin" not in read.headers, read.headers


def test_a_configured_origin_may_call_the_api_and_no_other(servers: dict[str, LiveServer]) -> None:
    with servers["open"].client() as client:
        allowed = preflight(client, OK_ORIGIN)
        assert allowed.status_code == 200, allowed.text
        assert allowed.headers["access-control-allow-origin"] == OK_ORIGIN
        assert "POST" in allowed.headers["access-control-allow-methods"]
        assert "content-type" in allowed.headers["access-control-allow-headers"].lower()
        read = client.get("/api/v1/runs", headers={"Origin": OK_ORIGIN})
        assert read.headers["access-control-allow-origin"] == OK_ORIGIN
        for origin in (EVIL, "https://ok.example.evil.example", "http://ok.example", "null"):
            refused = preflight(client, origin)
            assert_names(refused, 400, ["header", "origin"], "Disallowed CORS origin")
            assert "access-control-allow-origin" not in refused.headers, (origin, refused.headers)
            read = client.get("/api/v1/runs", headers={"Origin": origin})
            assert "access-control-allow-origin" not in read.headers, (origin, read.headers)


# --- the Host allowlist (DNS rebinding) ----------------------------------------------------------

PAGES = ["/", "/api/v1/runs", "/docs", "/api/v1/health"]


def port_of(live: LiveServer) -> int:
    port = httpx.URL(live.url).port
    assert port is not None
    return port


@pytest.mark.parametrize("page", PAGES)
def test_a_loopback_server_answers_only_its_loopback_names(sqlite_server: LiveServer, page: str) -> None:
    port = port_of(sqlite_server)
    with sqlite_server.client() as client:
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}", f"LOCALHOST:{port}"):
            assert client.get(page, headers={"Host": host}).status_code == 200, host
        for host in ("evil.example", f"evil.example:{port}", f"localhost.evil.example:{port}", "127.0.0.1.nip.io"):
            refused = client.get(page, headers={"Host": host})
            assert_names(refused, 400, ["header", "host"], "is not served here")
            assert_error_shape(refused, 400)


def test_a_rebound_name_cannot_write(sqlite_server: LiveServer) -> None:
    with sqlite_server.client() as client:
        key = register(client, world_size=1)
        headers = {"Host": "evil.example", "Content-Type": "application/json"}
        batch = json.dumps(steps_batch(key, 0, range(3))).encode()
        assert_names(client.post("/api/v1/ingest", content=batch, headers=headers), 400, ["header", "host"], "")
        capture = client.post(f"/api/v1/runs/{key}/capture", content=b'{"steps": 1}', headers=headers)
        assert_names(capture, 400, ["header", "host"], "")
    assert count_rows(sqlite_server.db_url, "steps", key) == 0
    assert count_rows(sqlite_server.db_url, "capture_requests", key) == 0


@pytest.mark.parametrize("page", PAGES)
def test_an_allowed_host_option_replaces_the_loopback_names(servers: dict[str, LiveServer], page: str) -> None:
    live = servers["named"]
    port = port_of(live)
    with live.client() as client:
        for host in (f"bubblescope.internal:{port}", "bubblescope.internal", f"127.0.0.1:{port}"):
            assert client.get(page, headers={"Host": host}).status_code == 200, host
        for host in (f"localhost:{port}", "evil.example", f"sub.bubblescope.internal:{port}"):
            assert_names(client.get(page, headers={"Host": host}), 400, ["header", "host"], "bubblescope.internal")


@pytest.mark.parametrize("page", PAGES)
def test_a_server_on_every_interface_answers_any_host(servers: dict[str, LiveServer], page: str) -> None:
    # Decision: bound to 0.0.0.0 (or another non-loopback address) with no --allowed-host, the
    # service cannot know the names it is reached by (a LAN address, a DNS name, a proxy's), so
    # it answers any Host, as before the allowlist; an operator who wants the protection names
    # them with --allowed-host. A loopback server, the default, knows its names and refuses others.
    live = servers["all_interfaces"]
    with live.client() as client:
        for host in ("evil.example", f"10.1.2.3:{port_of(live)}", "localhost"):
            assert client.get(page, headers={"Host": host}).status_code == 200, host


# --- capture requests: de-duplicated and limited per run ---------------------------------------


def capture(client: httpx.Client, key: str, steps: int = 2) -> httpx.Response:
    return client.post(f"/api/v1/runs/{key}/capture", json={"steps": steps})


def test_repeated_capture_requests_are_one_request(sqlite_server: LiveServer) -> None:
    with sqlite_server.client() as client:
        key = register(client, world_size=1)
        ingest(client, key, 0, range(3))  # newest step 2, 3 steps per batch: from_step 2 + 1 + 3 * 3
        first = capture(client, key)
        assert first.status_code == 201, first.text
        waiting = first.json()
        assert waiting["from_step"] == 12 and waiting["steps"] == 2
        for _ in range(299):
            again = capture(client, key)
            assert (again.status_code, again.json()) == (200, waiting)
        assert count_rows(sqlite_server.db_url, "capture_requests", key) == 1
        # the running job hears of the one request only, however often it was asked for
        assert ingest(client, key, 1, range(3, 4)) == [waiting]
        assert ingest(client, key, 2, range(4, 12)) == [waiting]
        # once a rank began it (step 12 shipped), a new request is a new one, further on
        assert ingest(client, key, 3, range(12, 13)) == [waiting]
        second = capture(client, key)
        assert second.status_code == 201, second.text
        assert second.json()["id"] != waiting["id"] and second.json()["from_step"] > 13
        assert capture(client, key).json() == second.json()
        assert ingest(client, key, 4, range(13, 14)) == [second.json()]  # the first one is done
    assert count_rows(sqlite_server.db_url, "capture_requests", key) == 2


def test_concurrent_capture_requests_are_one_request(sqlite_server: LiveServer) -> None:
    """The same, asked for at once (a dashboard open in several tabs, a script in a loop with
    threads): one request is created, whichever transaction comes first."""
    created = []
    for _ in range(3):
        with sqlite_server.client() as client:
            key = register(client, world_size=1)

        def ask(_: int) -> int:
            with sqlite_server.client() as client:
                return capture(client, key).status_code

        with ThreadPoolExecutor(16) as pool:
            statuses = list(pool.map(ask, range(48)))
        assert set(statuses) <= {200, 201}, statuses
        created.append((statuses.count(201), count_rows(sqlite_server.db_url, "capture_requests", key)))
    assert created == [(1, 1)] * 3


def test_capture_requests_past_the_hourly_limit_get_429(servers: dict[str, LiveServer]) -> None:
    live = servers["open"]  # --captures-per-hour 3
    with live.client() as client:
        key = register(client, world_size=1)
        for seq in range(3):
            created = capture(client, key)
            assert created.status_code == 201, created.text
            assert capture(client, key).status_code == 200  # the waiting one, not counted
            begin = created.json()["from_step"]
            ingest(client, key, seq, range(begin, begin + 1))  # a rank began it
        limited = capture(client, key)
        assert_names(limited, 429, ["path", "run_key"], "captures-per-hour")
        assert_error_shape(limited, 429)
        assert limited.json()["detail"][0]["type"] == "rate_limited"
        retry_after = limited.headers["retry-after"]
        assert retry_after.isdigit() and 1 <= int(retry_after) <= 3600, retry_after
        assert count_rows(live.db_url, "capture_requests", key) == 3
        other = register(client, world_size=1)  # the limit is per run
        assert capture(client, other).status_code == 201


# --- one error shape for every status ----------------------------------------------------------


def test_every_error_status_has_the_json_shape(sqlite_server: LiveServer) -> None:
    with sqlite_server.client() as client:
        key = register(client, world_size=1)
        for path in ("/api/v1/no-such-thing", "/no-such-page", "/static/no-such-file.js", "/vendor/nothing.js"):
            assert assert_error_shape(client.get(path), 404)[0]["type"] == "not_found", path
        wrong_method = client.delete("/api/v1/ingest")
        assert assert_error_shape(wrong_method, 405)[0]["type"] == "method_not_allowed"
        assert "POST" in wrong_method.headers["allow"]
        assert_error_shape(client.patch(f"/api/v1/runs/{key}"), 405)
        for response, loc in [
            (client.get(f"/api/v1/runs/{key}/steps/first"), ["path", "step"]),
            (client.get(f"/api/v1/runs/{key}/steps/-1"), ["path", "step"]),
            (client.put(f"/api/v1/runs/{key}/ranks/zero", json={"host": "h", "pid": 1}), ["path", "rank"]),
            (client.get("/api/v1/runs", params={"limit": "many"}), ["query", "limit"]),
            (client.get("/api/v1/runs/bad%20key!"), ["path", "run_key"]),
        ]:
            assert_error_shape(response, 422)
            assert response.json()["detail"][0]["loc"] == loc, response.text
        malformed = client.post("/api/v1/ingest", content=b'{"run_key": ', headers={"Content-Type": "application/json"})
        assert assert_error_shape(malformed, 400)[0]["loc"] == ["body"]
        assert assert_error_shape(client.get("/api/v1/runs/no-such-run"), 404)[0]["loc"] == ["path", "run_key"]


# --- liveness and readiness ----------------------------------------------------------------------


def test_health_and_ready_report_the_database(sqlite_server: LiveServer) -> None:
    with sqlite_server.client() as client:
        health = client.get("/api/v1/health")
        assert health.status_code == 200 and health.json()["database"] == "ok", health.text
        ready = client.get("/api/v1/ready")
        assert ready.status_code == 200, ready.text
        assert ready.json() == {"status": "ready", "schema_revision": migrate.head_revision(sqlite_server.db_url)}


def test_ready_fails_while_the_schema_is_behind_and_recovers_without_a_restart(
    servers: dict[str, LiveServer],
) -> None:
    live = servers["open"]
    head = migrate.head_revision(live.db_url)
    database = make_url(live.db_url).database
    assert database is not None

    def set_revision(revision: str | None) -> None:
        with sqlite3.connect(database) as connection:
            connection.execute("UPDATE alembic_version SET version_num = ?", (revision,))

    with live.client() as client:
        assert client.get("/api/v1/ready").status_code == 200
        set_revision("0000")
        try:
            behind = client.get("/api/v1/ready")
            detail = assert_error_shape(behind, 503)
            assert detail[0]["loc"] == ["database", "schema_revision"] and detail[0]["type"] == "schema_out_of_date"
            assert "0000" in detail[0]["msg"] and str(head) in detail[0]["msg"]
            assert behind.headers["retry-after"].isdigit(), behind.headers
            health = client.get("/api/v1/health").json()  # liveness stays 200 but says what it saw
            assert health["database"] == "unavailable" and "0000" in health["database_error"], health
        finally:
            set_revision(head)
        again = client.get("/api/v1/ready")
        assert again.status_code == 200 and again.json()["schema_revision"] == head, again.text
        assert client.get("/api/v1/health").json()["database"] == "ok"


# --- a database it cannot use: one line, exit 2, no traceback -----------------------------------


def serve_fails(db: str) -> str:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "bubblescope.cli", "serve", "--db", db, "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert time.monotonic() - started < 30
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_an_unreachable_postgres_is_one_line_at_start() -> None:
    line = serve_fails("postgresql+psycopg://postgres:s3cret@127.0.0.1:1/none")
    assert line.startswith("bubblescope serve: cannot reach the database"), line
    assert "127.0.0.1:1/none" in line and "refused" in line.lower(), line
    assert "s3cret" not in line  # the password stays out of logs and terminals


def test_an_sqlite_path_that_cannot_be_created_is_one_line_at_start(tmp_path: Path) -> None:
    regular = tmp_path / "a-file"
    regular.write_text("not a folder")
    under_a_file = regular / "sub" / "bubblescope.db"
    line = serve_fails(str(under_a_file))
    assert str(under_a_file) in line and "Not a directory" in line, line
    line = serve_fails(f"sqlite:///{regular / 'bubblescope.db'}")
    assert str(regular / "bubblescope.db") in line and "cannot open the database" in line, line
