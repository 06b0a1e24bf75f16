"""A run's derived views (step, analysis, stragglers) carry an ETag per run revision: an unchanged run
answers a revalidation with 304 and no body; any write to the run gives a new tag and a fresh answer."""

from __future__ import annotations

import time

import httpx
import pytest

from bubblescope.backend.warm_views import PAGE_BREAKDOWN_ROWS, PAGE_STRAGGLER_QUERY
from tests.support import LiveServer, ingest_batch, post_gzip, register

VIEWS = ("steps/1", "analysis", "stragglers")


def _post(client: httpx.Client, key: str, step: int) -> None:
    for rank in (0, 1):
        response = post_gzip(client, ingest_batch(key, seq=step, rank=rank, step=step))
        assert response.status_code == 202, response.text


@pytest.mark.parametrize("view", VIEWS)
def test_an_unchanged_run_revalidates_with_304_and_a_write_changes_the_answer(server: LiveServer, view: str) -> None:
    with server.client() as client:
        key = register(client)
        _post(client, key, 0)
        _post(client, key, 1)
        first = client.get(f"/api/v1/runs/{key}/{view}")
        assert first.status_code == 200, first.text
        tag = first.headers["etag"]
        assert client.get(f"/api/v1/runs/{key}/{view}").json() == first.json()  # the stored answer
        again = client.get(f"/api/v1/runs/{key}/{view}", headers={"If-None-Match": tag})
        assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == tag
        _post(client, key, 2)
        fresh = client.get(f"/api/v1/runs/{key}/{view}", headers={"If-None-Match": tag})
        assert fresh.status_code == 200 and fresh.headers["etag"] != tag
        if view == "stragglers":
            assert (first.json()["to_step"], fresh.json()["to_step"]) == (1, 2)
        if view == "analysis":
            assert (first.json()["steps"], fresh.json()["steps"]) == ([1], [1, 2])


def test_another_query_is_another_answer_and_an_unknown_run_is_still_a_404(server: LiveServer) -> None:
    with server.client() as client:
        key = register(client)
        for step in range(4):
            _post(client, key, step)
        whole = client.get(f"/api/v1/runs/{key}/stragglers")
        part = client.get(f"/api/v1/runs/{key}/stragglers", params={"from_step": 2})
        assert whole.headers["etag"] != part.headers["etag"]
        assert (whole.json()["from_step"], part.json()["from_step"]) == (0, 2)
        missing = client.get("/api/v1/runs/no-such-run/analysis", headers={"If-None-Match": whole.headers["etag"]})
        assert missing.status_code == 404 and "no-such-run" in missing.text


def test_the_stragglers_carry_only_the_phases_asked_for(server: LiveServer) -> None:
    with server.client() as client:
        key = register(client)
        for step in range(3):
            _post(client, key, step)
        everything = client.get(f"/api/v1/runs/{key}/stragglers").json()["matrices"]
        assert sorted(everything) == ["comm", "compute", "exposed_comm", "idle", "window"]
        one = client.get(f"/api/v1/runs/{key}/stragglers", params={"phases": "compute"}).json()["matrices"]
        assert list(one) == ["compute"] and one["compute"] == everything["compute"]
        bad = client.get(f"/api/v1/runs/{key}/stragglers", params={"phases": ["compute", "lunch"]})
        assert bad.status_code == 422 and "phases" in bad.text and "lunch" in bad.text


def test_a_quiet_runs_page_answers_are_stored_before_anyone_asks(server: LiveServer) -> None:
    """backend/warm_views.py: every 5 s, a run whose revision did not move since the last look."""
    with server.client() as client:
        key = register(client)
        for step in range(3):
            _post(client, key, step)
        time.sleep(16)  # two looks and a margin: the first sees the revision, the next warms
        analysis = client.get(f"/api/v1/runs/{key}/analysis")
        stragglers = client.get(f"/api/v1/runs/{key}/stragglers", params=list(PAGE_STRAGGLER_QUERY))
        assert analysis.headers["x-bubblescope-answer"] == "stored", analysis.headers
        assert stragglers.headers["x-bubblescope-answer"] == "stored", stragglers.headers
        assert analysis.json()["steps"] == [1, 2]
        again = client.get(f"/api/v1/runs/{key}/stragglers")  # all phases: not what the page asks for
        assert again.headers["x-bubblescope-answer"] == "computed"
        default = client.get(f"/api/v1/runs/{key}").json()["default_step"]
        limit = {"breakdown_limit": PAGE_BREAKDOWN_ROWS}
        opened = client.get(f"/api/v1/runs/{key}/steps/{default}", params=limit)  # the step the page opens on
        assert opened.headers["x-bubblescope-answer"] == "stored", opened.headers
        other = client.get(f"/api/v1/runs/{key}/steps/{3 - default}", params=limit)
        assert other.headers["x-bubblescope-answer"] == "computed"
