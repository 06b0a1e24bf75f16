"""A profile's traces at the service (``POST /runs/{key}/profiles/{id}?rank=R``, ``GET /runs/{key}/profiles``), on
SQLite and PostgreSQL, with real torch.profiler traces made here; and the collector's uploader against a live
server. The whole path from a job is tests/capture/test_profile_jobs.py."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from bubblescope.backend.profile_uploads import MAX_KEY, profile_run_key
from bubblescope.collector.capture import CaptureWindows, ProfileWindow
from bubblescope.collector.profiling import OnDemandProfiler, TraceUploader
from tests.capture.test_api import ingest
from tests.support import FILE_BODY, LiveServer, assert_names, profiled_trace, register, run_rows, upload_profile_trace


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("profile-traces")
    return {
        "rank0": profiled_trace(folder, 0, 40, 2),
        "rank1": profiled_trace(folder, 1, 40, 2),
        "early": profiled_trace(folder, 1, 30, 2),  # rank 1's, of steps the profile did not ask for
    }


def asked_profile(client: httpx.Client, world_size: int = 2, **body: Any) -> tuple[str, dict[str, Any]]:
    """A run whose newest step is 9 (so its profile's steps are 40 and 41: 9 + 1 + 3 * 10) and a profile of it."""
    key = register(client, world_size)
    ingest(client, key, rank=0, seq=0, steps=range(10))
    asked = client.post(f"/api/v1/runs/{key}/profile", json={"steps": 2, **body})
    assert asked.status_code == 201, asked.text
    assert asked.json()["from_step"] == 40, asked.json()
    return key, asked.json()


def test_each_rank_s_trace_is_imported_into_the_profile_s_run_and_listed(
    server: LiveServer, traces: dict[str, Path]
) -> None:
    with server.client() as client:
        key, asked = asked_profile(client)
        revision = run_rows(server.db_url, key, "SELECT revision FROM runs WHERE id = {run}")
        listed = client.get(f"/api/v1/runs/{key}/profiles").json()["profiles"]
        assert [(p["id"], p["from_step"], p["steps"], p["traces"]) for p in listed] == [(asked["id"], 40, 2, [])]
        stored = [upload_profile_trace(client, key, asked["id"], rank, traces[f"rank{rank}"]) for rank in (0, 1)]
        assert [response.status_code for response in stored] == [201, 201], [r.text for r in stored]
        trace_key = profile_run_key(key, asked["id"])
        assert {response.json()["run_key"] for response in stored} == {trace_key}
        assert run_rows(server.db_url, key, "SELECT revision FROM runs WHERE id = {run}") > revision  # the page hears
        again = upload_profile_trace(
            client, key, asked["id"], 1, traces["early"]
        )  # the first is kept, this body never read
        assert again.status_code == 200 and again.json() == stored[1].json()
        (listed,) = client.get(f"/api/v1/runs/{key}/profiles").json()["profiles"]
        assert listed["run_key"] == trace_key and listed["upload_ranks"] == [0, 1]
        assert [(t["rank"], t["file"]) for t in listed["traces"]] == [
            (0, "rank0-steps40-41.json.gz"),
            (1, "rank1-steps40-41.json.gz"),
        ]
        assert [t["bytes"] for t in listed["traces"]] == [traces[f"rank{r}"].stat().st_size for r in (0, 1)]
        imported = client.get(f"/api/v1/runs/{trace_key}").json()
        assert imported["name"].endswith("profile steps 40-41") and imported["world_size"] == 2
    steps = run_rows(server.db_url, trace_key, "SELECT DISTINCT rank, step FROM steps WHERE run_id = {run}")
    assert sorted(steps) == [(0, 40), (0, 41), (1, 40), (1, 41)]


def test_a_trace_the_profile_did_not_ask_for_is_refused_and_nothing_is_stored(
    server: LiveServer, traces: dict[str, Path]
) -> None:
    with server.client() as client:
        key, asked = asked_profile(client, upload_ranks=[1])
        profile_id = asked["id"]
        assert_names(
            upload_profile_trace(client, key, profile_id, 0, traces["rank0"]), 422, ["query", "rank"], "ranks [1] do"
        )
        assert_names(
            upload_profile_trace(client, key, profile_id + 999, 1, traces["rank1"]),
            404,
            ["path", "profile_id"],
            "no profile",
        )
        assert_names(
            upload_profile_trace(client, "no-such-run", profile_id, 1, traces["rank1"]),
            404,
            ["path", "run_key"],
            "no run",
        )
        other, _ = asked_profile(client)
        assert_names(
            upload_profile_trace(client, other, profile_id, 1, traces["rank1"]),
            404,
            ["path", "profile_id"],
            "no profile",
        )
        assert_names(upload_profile_trace(client, key, profile_id, 1, traces["early"]), 422, ["body"], "not profile")
        assert_names(
            upload_profile_trace(client, key, profile_id, 1, traces["rank0"]), 422, ["body"], "rank 0's, sent as rank 1"
        )
        assert_names(
            client.post(
                f"/api/v1/runs/{key}/profiles/{profile_id}", params={"rank": 1}, headers=FILE_BODY, content=b"{not json"
            ),
            422,
            ["body"],
            "",
        )
        assert client.get(f"/api/v1/runs/{key}/profiles").json()["profiles"][0]["traces"] == []
        assert client.get(f"/api/v1/runs/{profile_run_key(key, profile_id)}").status_code == 404
    stored = "SELECT count(*) FROM profile_traces JOIN capture_requests ON id = request_id WHERE run_id = {run}"
    assert run_rows(server.db_url, key, stored) == [(0,)]


def test_a_run_already_holding_the_profile_s_key_is_not_taken_over(
    sqlite_server: LiveServer, traces: dict[str, Path]
) -> None:
    with sqlite_server.client() as client:
        key, asked = asked_profile(client)
        squatter = profile_run_key(key, asked["id"])
        assert client.put(f"/api/v1/runs/{squatter}", json={"name": "x", "world_size": 2}).status_code == 200
        assert_names(
            upload_profile_trace(client, key, asked["id"], 0, traces["rank0"]), 409, ["path", "profile_id"], "exists"
        )
        assert client.get(f"/api/v1/runs/{key}/profiles").json()["profiles"][0]["traces"] == []


def test_a_profile_s_run_key_fits_and_stays_apart_for_long_keys() -> None:
    long_a, long_b = "a" * 127 + "x", "a" * 127 + "y"
    keys = {profile_run_key(key, 123456) for key in (long_a, long_b)}
    assert len(keys) == 2 and all(len(key) <= MAX_KEY and key.endswith(":profile-123456") for key in keys)
    assert profile_run_key("run-1", 7) == "run-1:profile-7"


def test_the_collector_s_uploader_sends_the_trace_and_says_what_it_could_not(
    sqlite_server: LiveServer, traces: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    with sqlite_server.client() as client:
        key, asked = asked_profile(client)
    window = ProfileWindow(40, 42, asked["id"], frozenset({0, 1}))
    uploader = TraceUploader(sqlite_server.url, None, key, timeout_s=60, pause_s=0.01)
    with caplog.at_level(logging.WARNING, logger="bubblescope"):
        uploader(traces["rank0"], window, 0)
        uploader(traces["rank0"], window, 0)  # stored already: the check answers it, the file is not sent again
        uploader(traces["early"], window, 1)  # refused: said, not retried, not raised
    assert caplog.text.count(f"uploaded: run {profile_run_key(key, asked['id'])}") == 2
    assert "was not uploaded (body: the trace's steps [30, 31] are not profile" in caplog.text
    with sqlite_server.client() as client:
        (listed,) = client.get(f"/api/v1/runs/{key}/profiles").json()["profiles"]
    assert [t["rank"] for t in listed["traces"]] == [0]


def test_only_the_ranks_named_upload_and_every_rank_keeps_its_trace(tmp_path: Path) -> None:
    sent: list[tuple[str, int, int]] = []
    for rank in (0, 1):
        windows = CaptureWindows()
        windows.learn({"captures": [{"id": 9, "from_step": 3, "steps": 1, "kind": "profile", "upload_ranks": [1]}]})
        profiler = OnDemandProfiler(
            windows, tmp_path, rank, lambda path, window, who: sent.append((path.name, window.request_id, who))
        )
        profiler.between_steps(3)
        torch.nn.Linear(8, 8)(torch.randn(2, 8)).sum().backward()
        profiler.between_steps(4)
        profiler.join(60)
    assert sent == [("rank1-steps3-3.json.gz", 9, 1)]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["rank0-steps3-3.json.gz", "rank1-steps3-3.json.gz"]


def test_asking_first_says_whether_to_send_and_hostile_uploads_get_a_4xx(
    server: LiveServer, traces: dict[str, Path]
) -> None:
    """``?check=true`` (no body): 204 while the service waits for the rank's trace, 200 with it once stored, the
    upload's own 404/422 otherwise; an id past int64, a form's content type: 4xx, never a 500."""
    with server.client() as client:
        key, asked = asked_profile(client)
        where = f"/api/v1/runs/{key}/profiles/{asked['id']}"
        assert client.post(where, params={"rank": 0, "check": "true"}).status_code == 204
        assert_names(client.post(where, params={"rank": 5, "check": "true"}), 422, ["query", "rank"], "does not upload")
        too_big = client.post(where, params={"rank": 0, "check": "true", "bytes": 2**40})
        assert_names(too_big, 413, ["query", "bytes"], "over")
        stored = upload_profile_trace(client, key, asked["id"], 0, traces["rank0"])
        assert stored.status_code == 201, stored.text
        again = client.post(where, params={"rank": 0, "check": "true"})
        assert again.status_code == 200 and again.json() == stored.json()
        assert stored.json()["uploaded_at"].endswith(("Z", "+00:00"))  # a time the browser reads as UTC
        listed = client.get(f"/api/v1/runs/{key}/profiles").json()
        assert listed["total"] == 1 and listed["profiles"][0]["asked_at"].endswith(("Z", "+00:00"))
        for huge in (2**63, 2**70):
            assert_names(
                client.post(f"/api/v1/runs/{key}/profiles/{huge}", params={"rank": 0}), 422, ["path", "profile_id"], ""
            )
        form = client.post(
            where, params={"rank": 1}, content=traces["rank1"].read_bytes(), headers={"Content-Type": "text/plain"}
        )
        assert_names(form, 415, ["header", "content-type"], "not accepted for a file")
        untyped = client.post(where, params={"rank": 1}, content=traces["rank1"].read_bytes())  # a page's no-cors POST
        assert_names(untyped, 415, ["header", "content-type"], "'none' is not accepted for a file")


def test_one_rank_sent_twice_at_once_is_stored_once(sqlite_server: LiveServer, traces: dict[str, Path]) -> None:
    with sqlite_server.client() as client:
        key, asked = asked_profile(client)
    answers: list[httpx.Response] = []

    def send() -> None:
        with sqlite_server.client() as client:
            answers.append(upload_profile_trace(client, key, asked["id"], 1, traces["rank1"]))

    senders = [threading.Thread(target=send) for _ in range(3)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(60)
    assert sorted(answer.status_code for answer in answers) == [200, 200, 201], [a.text for a in answers]
    assert len({answer.json()["uploaded_at"] for answer in answers}) == 1
    with sqlite_server.client() as client:
        (listed,) = client.get(f"/api/v1/runs/{key}/profiles").json()["profiles"]
    assert [t["rank"] for t in listed["traces"]] == [1]
    steps = run_rows(sqlite_server.db_url, listed["run_key"], "SELECT count(*) FROM steps WHERE run_id = {run}")
    assert steps == [(2,)]  # rank 1's two steps, once
