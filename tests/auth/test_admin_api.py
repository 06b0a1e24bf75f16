"""The admin endpoints: tokens (list, create, revoke) and the settings in force, secrets hidden."""

from __future__ import annotations

from bubblescope.backend.auth.scopes import Scope
from bubblescope.backend.settings import ServiceSettings
from bubblescope.backend.settings_view.service import settings_shown
from tests.auth.support import TRUSTED_HEADER, Tokens, bearer
from tests.support import LiveServer, assert_names


def test_tokens_are_created_listed_and_revoked(auth_server: LiveServer, tokens: Tokens) -> None:
    admin = bearer(tokens.valid[Scope.ADMIN])
    with auth_server.client() as client:
        created = client.post("/api/v1/tokens", json={"name": "dashboard-bob", "scope": "read"}, headers=admin)
        assert created.status_code == 201, created.text
        body = created.json()
        token = body["token"]
        assert body["name"] == "dashboard-bob" and body["scope"] == "read" and body["prefix"] == token[:10]
        assert client.get("/api/v1/runs", headers=bearer(token)).status_code == 200

        listed = client.get("/api/v1/tokens", headers=admin)
        assert listed.status_code == 200
        assert token not in listed.text and all("token" not in item for item in listed.json())
        [mine] = [item for item in listed.json() if item["name"] == "dashboard-bob"]
        assert mine["revoked_at"] is None and mine["last_used_at"] is not None

        revoked = client.delete(f"/api/v1/tokens/{body['prefix']}", headers=admin)
        assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
        assert client.get("/api/v1/runs", headers=bearer(token)).status_code == 401
        again = client.delete("/api/v1/tokens/dashboard-bob", headers=admin)
        assert_names(again, 404, ["path", "name_or_prefix"], "'dashboard-bob'")


def test_a_bad_token_request_names_its_field(auth_server: LiveServer, tokens: Tokens) -> None:
    admin = bearer(tokens.valid[Scope.ADMIN])
    with auth_server.client() as client:
        assert_names(
            client.post("/api/v1/tokens", json={"name": "x", "scope": "root"}, headers=admin),
            422,
            ["body", "scope"],
            "",
        )
        assert_names(
            client.post("/api/v1/tokens", json={"name": "a b", "scope": "read"}, headers=admin),
            422,
            ["body", "name"],
            "",
        )
        assert client.post("/api/v1/tokens", json={"name": "twice", "scope": "read"}, headers=admin).status_code == 201
        taken = client.post("/api/v1/tokens", json={"name": "twice", "scope": "admin"}, headers=admin)
        assert_names(taken, 422, ["body", "name"], "named 'twice' exists")


def test_the_settings_in_force(auth_server: LiveServer, tokens: Tokens) -> None:
    with auth_server.client() as client:
        answer = client.get("/api/v1/settings", headers=bearer(tokens.valid[Scope.ADMIN]))
    assert answer.status_code == 200, answer.text
    settings = answer.json()
    assert settings["auth"] is True and settings["trusted_user_header"] == TRUSTED_HEADER
    assert settings["max_batch_spans"] == ServiceSettings().max_batch_spans
    assert settings["allowed_hosts"] == ["localhost", "127.0.0.1", "::1"]


def test_the_settings_hide_webhook_paths_and_passwords() -> None:
    settings = ServiceSettings(
        webhook_urls=("https://hooks.example.org:8443/services/T000/B000/SECRETKEY",),
        alertmanager_urls=("http://ops:hunter2@alertmanager:9093", "http://alertmanager-b:9093"),
        external_url="https://bubblescope.example.org",
    )
    shown = settings_shown(settings)
    assert shown["webhook_urls"] == ["https://hooks.example.org:8443/<hidden>"]
    assert shown["alertmanager_urls"] == ["http://ops:<hidden>@alertmanager:9093", "http://alertmanager-b:9093"]
    assert shown["external_url"] == "https://bubblescope.example.org"
    assert "SECRETKEY" not in str(shown) and "hunter2" not in str(shown)
