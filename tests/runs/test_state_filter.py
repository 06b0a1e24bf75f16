"""GET /api/v1/runs?state=: only runs in the asked states (several allowed), paged after filtering, so
a poller asking for failed runs finds an old one behind a hundred newer healthy ones."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bubblescope.backend.db import migrate
from bubblescope.backend.runs.service import SCAN_CHUNK
from tests.support import LiveServer, assert_names, register, start_server


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder: Path = tmp_path_factory.mktemp("state-filter")
    url = f"sqlite:///{folder / 'bubblescope.db'}"
    migrate.upgrade(url)
    live = start_server(url, folder)
    yield live
    live.stop()


def end(client: httpx.Client, key: str, outcome: str) -> None:
    assert client.put(f"/api/v1/runs/{key}/ranks/0", json={"host": "h", "pid": 1}).status_code == 200
    body = {"outcome": outcome, **({"error": "RuntimeError: boom"} if outcome == "failed" else {})}
    assert client.put(f"/api/v1/runs/{key}/ranks/0/end", json=body).status_code == 200


def test_the_state_filter_reaches_past_a_chunk_of_other_runs(own_server: LiveServer) -> None:
    with own_server.client() as client:
        failed = register(client, world_size=1)
        end(client, failed, "failed")
        finished = register(client, world_size=1)
        end(client, finished, "finished")
        newer = [register(client, world_size=1) for _ in range(SCAN_CHUNK + 20)]  # running, all newer

        def keys(**params: object) -> list[str]:
            response = client.get("/api/v1/runs", params=params)
            assert response.status_code == 200, response.text
            return [run["key"] for run in response.json()]

        assert keys(state="failed") == [failed]
        assert keys(state=["failed", "finished"]) == [finished, failed]  # most recently active first
        assert keys(state=["failed", "finished"], limit=1, offset=1) == [failed]
        running = keys(state="running", limit=1000)
        assert set(running) == set(newer) and len(running) == len(newer)
        assert failed not in keys()  # unfiltered: the newest 100, as before
        assert_names(client.get("/api/v1/runs", params={"state": "broken"}), 422, ["query", "state", 0], "")


def follow(client: httpx.Client, **params: object) -> list[list[str]]:
    """Every page, by following X-Next-Cursor until it is absent."""
    pages: list[list[str]] = []
    while True:
        response = client.get("/api/v1/runs", params=params)
        assert response.status_code == 200, response.text
        pages.append([run["key"] for run in response.json()])
        following = response.headers.get("x-next-cursor")
        if following is None:
            assert "link" not in response.headers
            return pages
        assert response.headers["link"].endswith('; rel="next"') and f"cursor={following}" in response.headers["link"]
        params = {**params, "cursor": following}


def test_a_cursor_pages_through_every_run_once(own_server: LiveServer) -> None:
    with own_server.client() as client:
        failed_run = register(client, world_size=1)
        end(client, failed_run, "failed")
        for _ in range(200):
            register(client, world_size=1)
        every = [run["key"] for run in client.get("/api/v1/runs", params={"limit": 1000}).json()]
        pages = follow(client, limit=97)
        assert [key for page in pages for key in page] == every
        assert all(len(page) == 97 for page in pages[:-1]) and 0 < len(pages[-1]) <= 97
        failed = [run["key"] for run in client.get("/api/v1/runs", params={"state": "failed"}).json()]
        assert [key for page in follow(client, limit=1, state="failed") for key in page] == failed
        assert_names(client.get("/api/v1/runs", params={"cursor": 0}), 422, ["query", "cursor"], "")
