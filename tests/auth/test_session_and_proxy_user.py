"""The dashboard's session cookie and the reverse proxy's user header, on a real ``serve --auth``."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from bubblescope.backend.auth.cache import TTL_S
from bubblescope.backend.auth.scopes import Scope
from bubblescope.backend.db.engine import build_engine
from tests.auth.support import TRUSTED_HEADER, Tokens, bearer, make_token
from tests.support import LiveServer, assert_names, migrated_database, start_server

COOKIE = "bubblescope_session"


def test_signing_in_sets_an_httponly_strict_cookie_the_api_accepts(auth_server: LiveServer, tokens: Tokens) -> None:
    with auth_server.client() as client:
        signed_in = client.post("/api/v1/session", json={"token": tokens.valid[Scope.READ]})
        assert signed_in.status_code == 200, signed_in.text
        assert signed_in.json()["scope"] == "read"
        cookie = signed_in.headers["set-cookie"]
        attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
        assert cookie.startswith(f"{COOKIE}=") and {"httponly", "samesite", "path", "max-age"} <= attributes
        assert "samesite=strict" in cookie.lower() and "secure" not in attributes  # plain http here
        assert client.get("/api/v1/runs").status_code == 200  # the cookie, kept by the client, is accepted
        assert client.delete(f"/api/v1/runs/{'x' * 8}").status_code == 403  # as the read token it holds

        signed_out = client.delete("/api/v1/session")
        assert signed_out.status_code == 204
        assert "max-age=0" in signed_out.headers["set-cookie"].lower()
        assert COOKIE not in client.cookies
        assert client.get("/api/v1/runs").status_code == 401


def test_the_cookie_is_secure_when_the_request_came_over_https(auth_server: LiveServer, tokens: Tokens) -> None:
    """Behind a TLS-terminating proxy on the same host (uvicorn trusts its X-Forwarded-Proto)."""
    with auth_server.client() as client:
        answer = client.post(
            "/api/v1/session", json={"token": tokens.valid[Scope.ADMIN]}, headers={"X-Forwarded-Proto": "https"}
        )
    assert answer.status_code == 200, answer.text
    assert "secure" in {part.strip().lower() for part in answer.headers["set-cookie"].split(";")}


def test_sign_in_refuses_an_ingest_unknown_or_revoked_token(auth_server: LiveServer, tokens: Tokens) -> None:
    with auth_server.client() as client:
        ingest = client.post("/api/v1/session", json={"token": tokens.valid[Scope.INGEST]})
        assert_names(ingest, 403, ["body", "token"], "has scope 'ingest'")
        unknown = client.post("/api/v1/session", json={"token": "bs_" + "x" * 43})
        assert_names(unknown, 401, ["body", "token"], "not known")
        revoked = client.post("/api/v1/session", json={"token": tokens.revoked[Scope.READ]})
        assert_names(revoked, 401, ["body", "token"], "revoked")
        missing = client.post("/api/v1/session", json={})
        assert_names(missing, 422, ["body", "token"], "")
        assert "set-cookie" not in ingest.headers and "set-cookie" not in revoked.headers


def test_the_session_is_the_servers_ended_by_sign_out_expiry_and_revocation(
    auth_server: LiveServer, auth_db: str, tokens: Tokens
) -> None:
    """The probe's finding: the cookie was the raw API token, so signing out did not end the session and its
    7 days were the browser's word. Now the cookie names a server-side session."""
    token = make_token(auth_db, Scope.READ)
    with auth_server.client() as client:
        signed_in = client.post("/api/v1/session", json={"token": token})
        assert signed_in.status_code == 200, signed_in.text
        held = client.cookies[COOKIE]
        assert held.startswith("bss_") and token not in signed_in.headers["set-cookie"]  # not the token
        assert client.get("/api/v1/runs").status_code == 200
        assert client.delete("/api/v1/session").status_code == 204
    with auth_server.client() as replay:  # the cookie kept by someone, sent after signing out
        replay.cookies.set(COOKIE, held)
        assert_names(replay.get("/api/v1/runs"), 401, ["cookie", COOKIE], "signed out, expired")

    with auth_server.client() as client:  # expired on the server, whatever the browser keeps
        assert client.post("/api/v1/session", json={"token": token}).status_code == 200
        assert client.get("/api/v1/runs").status_code == 200
        engine = build_engine(auth_db)
        with engine.begin() as connection:
            digest = hashlib.sha256(client.cookies[COOKIE].encode()).hexdigest()
            connection.execute(
                text("UPDATE sessions SET expires_at = '2000-01-01 00:00:00' WHERE session_hash = :digest"),
                {"digest": digest},
            )
        engine.dispose()
        time.sleep(TTL_S + 0.5)  # what the service remembered of it
        assert client.get("/api/v1/runs").status_code == 401

    with auth_server.client() as client:  # revoking the token ends its sessions
        assert client.post("/api/v1/session", json={"token": token}).status_code == 200
        admin = bearer(tokens.valid[Scope.ADMIN])
        name = next(t["name"] for t in client.get("/api/v1/tokens", headers=admin).json() if t["prefix"] == token[:10])
        assert client.delete(f"/api/v1/tokens/{name}", headers=admin).status_code == 200
        assert client.get("/api/v1/runs").status_code == 401


def test_a_cookie_holding_a_token_is_not_a_session(auth_server: LiveServer, tokens: Tokens) -> None:
    with auth_server.client() as client:
        client.cookies.set(COOKIE, tokens.valid[Scope.ADMIN])
        answer = client.get("/api/v1/runs")
    assert_names(answer, 401, ["cookie", COOKIE], "sign in again")


def test_the_proxy_user_header_gives_read(auth_server: LiveServer, tokens: Tokens) -> None:
    user = {TRUSTED_HEADER: "alice@example.org"}
    with auth_server.client() as client:
        assert client.get("/api/v1/runs", headers=user).status_code == 200
        assert client.get("/metrics", headers=user).status_code == 200
        admin_only = client.get("/api/v1/tokens", headers=user)
        assert_names(admin_only, 403, ["header", TRUSTED_HEADER], "needs scope 'admin'")
        assert "'alice@example.org'" in admin_only.json()["detail"][0]["msg"]
        ingest = client.post("/api/v1/ingest", json={}, headers=user)
        assert_names(ingest, 403, ["header", TRUSTED_HEADER], "has scope 'read'")
        empty = client.get("/api/v1/runs", headers={TRUSTED_HEADER: ""})
        assert empty.status_code == 401
        # a token sent with it decides alone: an admin token keeps admin, a bad one is refused
        admin = {**user, **bearer(tokens.valid[Scope.ADMIN])}
        assert client.get("/api/v1/tokens", headers=admin).status_code == 200
        bad = {**user, **bearer(tokens.revoked[Scope.READ])}
        assert client.get("/api/v1/runs", headers=bad).status_code == 401


@pytest.fixture(scope="module")
def server_without_proxy_header(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with migrated_database("sqlite", tmp_path_factory.mktemp("no-proxy-db")) as url:
        live = start_server(url, tmp_path_factory.mktemp("no-proxy"), extra_args=["--auth"])
        yield live
        live.stop()


def test_the_header_means_nothing_unless_serve_names_it(server_without_proxy_header: LiveServer) -> None:
    with server_without_proxy_header.client() as client:
        answer = client.get("/api/v1/runs", headers={TRUSTED_HEADER: "mallory"})
    assert answer.status_code == 401, answer.text


@pytest.fixture(scope="module")
def server_behind_another_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The header is honoured from 10.9.9.9 alone: these tests connect from 127.0.0.1."""
    with migrated_database("sqlite", tmp_path_factory.mktemp("other-proxy-db")) as url:
        extra = ["--auth", "--trusted-user-header", TRUSTED_HEADER, "--trusted-proxy", "10.9.9.9"]
        live = start_server(url, tmp_path_factory.mktemp("other-proxy"), extra_args=extra)
        yield live
        live.stop()


def test_the_header_from_an_address_that_is_no_trusted_proxy_is_refused(
    server_behind_another_proxy: LiveServer,
) -> None:
    """The probe's finding: the header was honoured from any client. Now only on connections from --trusted-proxy;
    an X-Forwarded-For naming the proxy does not make a connection come from it."""
    with server_behind_another_proxy.client() as client:
        direct = client.get("/api/v1/runs", headers={TRUSTED_HEADER: "mallory"})
        assert_names(direct, 401, ["header", TRUSTED_HEADER], "honoured only from the proxies of --trusted-proxy")
        assert "came from 127.0.0.1" in direct.text
        spoofed = client.get("/api/v1/runs", headers={TRUSTED_HEADER: "mallory", "X-Forwarded-For": "10.9.9.9"})
        assert spoofed.status_code == 401, spoofed.text
        assert client.get("/api/v1/health", headers={TRUSTED_HEADER: "mallory"}).status_code == 200  # public


def test_the_header_sent_twice_is_refused(auth_server: LiveServer) -> None:
    """The probe's finding: with the header twice, the first won (a proxy that appends lets a client choose)."""
    with auth_server.client() as client:
        twice = client.get("/api/v1/runs", headers=[(TRUSTED_HEADER, "mallory"), (TRUSTED_HEADER, "alice")])
    assert_names(twice, 401, ["header", TRUSTED_HEADER], "came 2 times")


def test_serve_refuses_the_header_without_the_proxies_that_set_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bubblescope.cli", "serve", "--db", str(tmp_path / "x.db"), "--auth"]
        + ["--trusted-user-header", TRUSTED_HEADER],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--trusted-user-header needs --trusted-proxy" in done.stderr, done.stderr
