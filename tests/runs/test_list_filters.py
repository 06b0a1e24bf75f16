"""GET /runs?name=&since=: runs whose name or key holds a text (any case, % and _ taken literally), and
runs heard from since a time; on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import httpx

from tests.support import LiveServer


def _register(client: httpx.Client, name: str) -> str:
    key = f"filter-{uuid.uuid4().hex[:10]}"
    response = client.put(f"/api/v1/runs/{key}", json={"name": name, "world_size": 1})
    assert response.status_code == 200, response.text
    return key


def _names(client: httpx.Client, **params: str) -> set[str]:
    response = client.get("/api/v1/runs", params={"limit": 1000, **params})
    assert response.status_code == 200, response.text
    return {run["name"] for run in response.json()}


def test_runs_are_found_by_part_of_their_name_or_key_and_by_when_they_were_heard(server: LiveServer) -> None:
    tag = uuid.uuid4().hex[:8]
    with server.client() as client:
        names = [f"Alpha-{tag}", f"beta-{tag.upper()}", f"gamma_%-{tag}"]
        keys = [_register(client, name) for name in names]
        assert _names(client, name=tag) == set(names)  # any case
        assert _names(client, name=f"_%-{tag}") == {names[2]}  # % and _ literally
        assert _names(client, name=f"a_-{tag}") == set()
        assert _names(client, name=keys[1]) == {names[1]}  # the key too
        hour = timedelta(hours=1)
        past = (datetime.now(timezone.utc) - hour).isoformat()
        future = (datetime.now(timezone.utc) + hour).isoformat()
        assert _names(client, name=tag, since=past) == set(names)
        assert _names(client, name=tag, since=future) == set()
        for bad_time in ("yesterday", "0.5", "2026-13-40T10:00:00Z"):
            bad = client.get("/api/v1/runs", params={"since": bad_time})
            assert bad.status_code == 422 and "since" in bad.text, bad.text
