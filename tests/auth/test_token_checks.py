"""How a presented token is checked: by its SHA-256, compared in constant time, remembered a few
seconds (a revocation takes effect within them), its use recorded at most once a minute, and every
refusal counted in /metrics."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from bubblescope.backend.auth import cache as cache_module, tokens as tokens_module
from bubblescope.backend.auth.cache import TOUCH_EVERY_S, TTL_S, TokenCache
from bubblescope.backend.auth.scopes import Scope
from bubblescope.backend.auth.tokens import token_digest
from bubblescope.backend.db.engine import build_engine, build_session_factory
from bubblescope.cli import main
from tests.auth.support import Tokens, auth_failures, bearer, make_token
from tests.support import LiveServer, migrated_database, wait_until


def last_used(db_url: str, token: str) -> object:
    engine = create_engine(db_url)
    try:
        with engine.connect() as connection:
            query = text("SELECT last_used_at FROM api_tokens WHERE token_hash = :digest")
            return connection.execute(query, {"digest": token_digest(token)}).scalar_one()
    finally:
        engine.dispose()


def test_a_wrong_token_of_the_right_length_and_prefix_is_refused(auth_server: LiveServer, tokens: Tokens) -> None:
    good = tokens.valid[Scope.READ]
    for wrong in (good[:-1] + ("A" if good[-1] != "A" else "B"), good[:20] + good[20:].swapcase()):
        assert len(wrong) == len(good) and wrong[:10] == good[:10] and wrong != good
        with auth_server.client() as client:
            answer = client.get("/api/v1/runs", headers=bearer(wrong))
        assert answer.status_code == 401, answer.text
        assert "not known" in answer.json()["detail"][0]["msg"]


def test_digests_are_compared_in_constant_time() -> None:
    """The lookup is by digest; the final comparison of digests is ``hmac.compare_digest``."""
    assert "hmac.compare_digest" in inspect.getsource(tokens_module.same_digest)
    assert "same_digest(" in inspect.getsource(cache_module._checked)
    assert "==" not in inspect.getsource(cache_module._checked)


def test_every_refusal_is_counted_by_reason(auth_server: LiveServer, tokens: Tokens) -> None:
    with auth_server.client() as client:
        before = auth_failures(client, tokens.valid[Scope.READ])
        client.get("/api/v1/runs")  # missing
        client.get("/api/v1/runs", headers={"Authorization": "Basic dXNlcjpwdw=="})  # malformed
        client.get("/api/v1/runs", headers=bearer("bs_" + "0" * 43))  # unknown
        client.get("/api/v1/runs", headers=bearer("bs_" + "0" * 43))  # unknown again (from the cache)
        client.get("/api/v1/runs", headers=bearer(tokens.revoked[Scope.READ]))  # revoked
        client.get("/api/v1/tokens", headers=bearer(tokens.valid[Scope.READ]))  # wrong_scope
        client.get("/api/v1/runs/team-z-1", headers=bearer(tokens.bound_elsewhere[Scope.READ]))  # wrong_run
        client.get("/api/v1/runs", headers=bearer(tokens.valid[Scope.READ]))  # allowed: not counted
        after = auth_failures(client, tokens.valid[Scope.READ])
    counted = {reason: after[reason] - before.get(reason, 0.0) for reason in after}
    expected = {"missing": 1, "malformed": 1, "unknown": 2, "revoked": 1, "wrong_scope": 1, "wrong_run": 1}
    assert counted == {**expected, "untrusted_proxy": 0, "throttled": 0}  # every reason exported from the start


def test_a_token_revoked_through_the_api_is_refused_at_once(auth_server: LiveServer, tokens: Tokens) -> None:
    with auth_server.client() as client:
        created = client.post(
            "/api/v1/tokens", json={"name": "short-lived", "scope": "read"}, headers=bearer(tokens.valid[Scope.ADMIN])
        )
        assert created.status_code == 201, created.text
        token = created.json()["token"]
        assert client.get("/api/v1/runs", headers=bearer(token)).status_code == 200  # now in the cache
        revoked = client.delete("/api/v1/tokens/short-lived", headers=bearer(tokens.valid[Scope.ADMIN]))
        assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
        assert client.get("/api/v1/runs", headers=bearer(token)).status_code == 401


def test_a_token_revoked_by_another_process_is_refused_within_the_cache_time(
    auth_server: LiveServer, auth_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    token = make_token(auth_db, Scope.READ)
    with auth_server.client() as client:
        assert client.get("/api/v1/runs", headers=bearer(token)).status_code == 200  # now in the cache
        assert main(["token", "revoke", token[:10], "--db", auth_db]) == 0  # the CLI: another process's view
        wait_until(
            lambda: client.get("/api/v1/runs", headers=bearer(token)).status_code == 401,
            timeout_s=TTL_S + 25,  # the cache's few seconds, with room for a loaded machine
            what="the revoked token to be refused",
            interval_s=0.25,
        )


def test_last_used_is_recorded(auth_server: LiveServer, auth_db: str) -> None:
    token = make_token(auth_db, Scope.INGEST)
    assert last_used(auth_db, token) is None
    with auth_server.client() as client:
        answer = client.post("/api/v1/ingest", json={}, headers=bearer(token))
    assert answer.status_code == 422  # past the guard
    assert last_used(auth_db, token) is not None  # written before the answer


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_cache_forgets_after_its_ttl_and_touches_once_a_minute(tmp_path: Path) -> None:
    with migrated_database("sqlite", tmp_path) as url:
        token = make_token(url, Scope.READ)
        engine = build_engine(url)
        clock = FakeClock()
        cache = TokenCache(build_session_factory(engine), clock=clock)
        digest = token_digest(token)
        assert cache.cached(digest) == (False, None)
        loaded = cache.load(digest)
        assert loaded is not None and loaded.scope is Scope.READ and not loaded.revoked
        assert cache.cached(digest) == (True, loaded)
        assert cache.cached(token_digest(token + "x")) == (False, None)
        clock.now += TTL_S + 0.1
        assert cache.cached(digest) == (False, None)  # asks the database again: a revocation is seen

        assert cache.claim_touch(loaded.id)
        clock.now += TOUCH_EVERY_S - 1
        assert not cache.claim_touch(loaded.id)
        clock.now += 2
        assert cache.claim_touch(loaded.id)
        engine.dispose()


def test_an_unknown_token_is_remembered_as_unknown(tmp_path: Path) -> None:
    with migrated_database("sqlite", tmp_path) as url:
        engine = build_engine(url)
        cache = TokenCache(build_session_factory(engine), clock=FakeClock())
        digest = token_digest("bs_" + "1" * 43)
        assert cache.load(digest) is None
        assert cache.cached(digest) == (True, None)  # no query for it until the TTL is over
        engine.dispose()
