"""Token guessing slowed per client (``auth.throttle``): past 20 unknown tokens a minute from one client, 429 with
Retry-After and no lookup; a token the service has seen valid still passes. Real server, SQLite."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import httpx
import pytest

from bubblescope.backend.auth.scopes import Scope
from bubblescope.backend.settings import ServiceSettings
from tests.auth.support import bearer, make_token
from tests.support import LiveServer, assert_names, migrated_database, start_server

MAX_FAILURES = ServiceSettings().unknown_tokens_per_minute  # the default


@pytest.fixture
def guessed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, str]]:
    with migrated_database("sqlite", tmp_path_factory.mktemp("guess-db")) as url:
        token = make_token(url, Scope.READ)
        live = start_server(url, tmp_path_factory.mktemp("guess"), extra_args=["--auth"])
        yield live, token
        live.stop()


def test_guessing_tokens_is_slowed_but_a_known_token_passes(guessed_server: tuple[LiveServer, str]) -> None:
    live, token = guessed_server
    with live.client() as client:
        assert client.get("/api/v1/runs", headers=bearer(token)).status_code == 200  # seen valid
        answers = [client.get("/api/v1/runs", headers=bearer(f"bs_guess{i:040d}")) for i in range(MAX_FAILURES)]
        assert [a.status_code for a in answers] == [401] * MAX_FAILURES
        throttled = client.get("/api/v1/runs", headers=bearer("bs_guess" + "9" * 40))
        assert_names(throttled, 429, ["header", "Authorization"], f"{MAX_FAILURES} unknown tokens from")
        assert 0 < int(throttled.headers["Retry-After"]) <= 60
        signing_in = client.post("/api/v1/session", json={"token": "bs_guess" + "8" * 40})
        assert_names(signing_in, 429, ["body", "token"], "retry in")
        assert client.get("/api/v1/runs", headers=bearer(token)).status_code == 200  # the team's token still works


def test_guesses_sent_at_once_are_counted_as_they_arrive(guessed_server: tuple[LiveServer, str]) -> None:
    """The review's finding: counted only after the lookup, a burst sent at once all passed the count. Each
    unknown token counts before its lookup now: of 60 sent at once, at most the limit are looked up (401)."""
    live, _token = guessed_server

    def guess(index: int) -> int:
        return httpx.get(f"{live.url}/api/v1/runs", headers=bearer(f"bs_burst{index:040d}"), timeout=60).status_code

    with concurrent.futures.ThreadPoolExecutor(30) as pool:
        statuses = list(pool.map(guess, range(60)))
    assert statuses.count(401) <= MAX_FAILURES and statuses.count(429) >= 60 - MAX_FAILURES, statuses
