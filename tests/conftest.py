"""Fixtures shared by every test package."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bubblescope.backend.db import migrate
from tests.support import (
    REPO,
    LiveServer,
    migrated_database,
    require_program,
    start_server,
)

BACKENDS = ["sqlite", "postgres"]
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="session")
def output_dir() -> Path:
    """Screenshots and logs a person may want to look at after the run."""
    path = REPO / "test-output"
    path.mkdir(exist_ok=True)
    return path


def _database(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with migrated_database(backend, tmp_path_factory.mktemp("db")) as url:
        yield url


# The databases and servers live for the whole session, shared by every module: starting a
# uvicorn process costs 1.5-2.5 s on a loaded 2-core machine, and twenty modules use one. Tests
# keep to their own runs (unique run keys), so what other modules stored does not concern them.
@pytest.fixture(scope="session", params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A database built by running the migrations: SQLite always, PostgreSQL when reachable."""
    yield from _database(request.param, tmp_path_factory)


@pytest.fixture(scope="session")
def server(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A real ``bubblescope serve`` (uvicorn) process on a free loopback port."""
    live = start_server(db_url, tmp_path_factory.mktemp("server"))
    yield live
    live.stop()


@pytest.fixture(scope="session")
def sqlite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'bubblescope.db'}"
    migrate.upgrade(url)
    live = start_server(url, tmp_path_factory.mktemp("server"))
    yield live
    live.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's headless Chromium, driven by Playwright (a test tool's own browser download does not work here)."""
    require_program(CHROMIUM, "chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield instance
        instance.close()
