"""The access tests' service: ``serve --auth --trusted-user-header X-Forwarded-User --trusted-proxy 127.0.0.1`` on
an SQLite
database of its own, with a valid and a revoked token of each scope."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.auth.support import TRUSTED_HEADER, Tokens, issue_tokens
from tests.support import LiveServer, migrated_database, start_server


@pytest.fixture(scope="module")
def auth_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with migrated_database("sqlite", tmp_path_factory.mktemp("auth-db")) as url:
        yield url


@pytest.fixture(scope="module")
def tokens(auth_db: str) -> Tokens:
    return issue_tokens(auth_db)


@pytest.fixture(scope="module")
def auth_server(auth_db: str, tokens: Tokens, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    extra = ["--auth", "--trusted-user-header", TRUSTED_HEADER, "--trusted-proxy", "127.0.0.1"]
    live = start_server(auth_db, tmp_path_factory.mktemp("auth-server"), extra_args=extra)
    yield live
    live.stop()
