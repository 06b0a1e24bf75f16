"""Fixtures shared by every test package."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bubblescope.backend.db import migrate
from tests.cpu_share import cpu_share, make_lock_folder, remove_lock_folder
from tests.support import (
    REPO,
    LiveServer,
    migrated_database,
    require_program,
    start_server,
)

BACKENDS = ["sqlite", "postgres"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A ``timing`` test runs with no other test beside it (tests/cpu_share.py)."""
    with cpu_share(alone=item.get_closest_marker("timing") is not None):
        yield


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without workers)
        make_lock_folder()


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        remove_lock_folder()


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


@pytest.fixture(scope="session")
def fr_dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real Flight Recorder dumps, pickle and JSON, of ``tests/traces/fr_job.py`` (gloo, 2 ranks; rank 1 leaves
    the last all-reduce out and rank 0 is dumped blocked in it): nccl_trace_rank_N and trace_rank_N.json."""
    out = tmp_path_factory.mktemp("fr")
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "100", "OMP_NUM_THREADS": "1"}
    job = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
        + [str(REPO / "tests/traces/fr_job.py"), f"--out={out}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]
    return out
