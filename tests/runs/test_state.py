"""A run's state (running, hung, finished, failed, silent): the rule on numbers, and
PUT /api/v1/runs/{key}/ranks/{rank}/end with the state it gives, on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest

from bubblescope.backend.db import migrate
from bubblescope.backend.store.state import RankEnd, run_state
from tests.support import LiveServer, assert_names, register, start_server

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=timezone.utc)


def state_of(ends: list[RankEnd], quiet_s: float, world: int = 2, silent_after_s: float = 60) -> tuple[str, str]:
    found = run_state(world, ends, NOW - timedelta(seconds=quiet_s), NOW, silent_after_s)
    return found.state, found.detail


def test_a_failed_rank_fails_the_run_whatever_the_others_did() -> None:
    state, detail = state_of([RankEnd(0, "finished"), RankEnd(1, "failed", "RuntimeError: boom")], quiet_s=1)
    assert state == "failed" and detail == "rank 1 failed: RuntimeError: boom"
    state, detail = state_of(
        [RankEnd(2, "failed", "B"), RankEnd(0, None), RankEnd(1, "failed", "A")], quiet_s=900, world=3
    )
    assert state == "failed" and detail == "rank 1 failed first: A (then rank 2)"  # no end times: rank order


def test_the_first_rank_to_fail_on_the_aligned_clock_is_named() -> None:
    ends = [
        RankEnd(0, "failed", "RuntimeError: Connection closed by peer", end_ns=2_000),
        RankEnd(3, "failed", "torch.OutOfMemoryError: CUDA out of memory", end_ns=1_000),
        RankEnd(1, "failed", "RuntimeError: Connection closed by peer", end_ns=None),
        RankEnd(2, "finished", end_ns=500),
    ]
    state, detail = state_of(ends, quiet_s=1, world=4)
    assert (state, detail) == (
        "failed",
        "rank 3 failed first: torch.OutOfMemoryError: CUDA out of memory (then ranks 0, 1)",
    )


def test_finished_needs_every_rank_of_the_world() -> None:
    assert state_of([RankEnd(0, "finished"), RankEnd(1, "finished")], quiet_s=900)[0] == "finished"
    state, detail = state_of([RankEnd(0, "finished")], quiet_s=5)  # rank 1 never registered an end
    assert state == "running" and detail == "last heard 5 s ago; 1 of 2 ranks finished"


def test_hung_while_a_watchdog_reports_a_long_step_and_running_again_when_it_stops() -> None:
    heard = NOW - timedelta(seconds=2)
    blocked = {"step": 7, "in_step": True, "elapsed_s": 41.0, "op": {"kind": "all_reduce", "peer": 1, "elapsed_s": 40}}
    computing = {"step": 7, "in_step": True, "elapsed_s": 42.0, "op": None}
    ends = [
        RankEnd(0, None, last_heard_at=heard, host="a", in_flight=blocked),
        RankEnd(1, None, last_heard_at=heard, host="b", in_flight=computing),
    ]
    state, detail = state_of(ends, quiet_s=2)
    assert state == "hung", detail
    assert detail == "step 7 has run for 44 s: the others wait for rank 1 (host b)"  # 42 s reported 2 s ago
    moving = [RankEnd(r.rank, None, last_heard_at=heard, host=r.host) for r in ends]  # steps again: no reports
    assert state_of(moving, quiet_s=2)[0] == "running"
    stale = [RankEnd(r.rank, None, last_heard_at=NOW - timedelta(seconds=300), in_flight=blocked) for r in ends]
    assert state_of(stale, quiet_s=300)[0] == "silent"  # the reports stopped long ago: killed, not hung
    failed = [*ends[:1], RankEnd(1, "failed", "RuntimeError: boom")]
    assert state_of(failed, quiet_s=2)[0] == "failed"


def test_silent_once_nothing_is_heard_for_the_threshold() -> None:
    assert state_of([RankEnd(0, None), RankEnd(1, None)], quiet_s=59.9)[0] == "running"
    state, detail = state_of([RankEnd(0, None), RankEnd(1, "finished")], quiet_s=125)
    assert state == "silent"
    assert detail.startswith("nothing heard for 2 min 5 s, and 1 of 2 ranks never reported an end")
    naive_last_contact = (NOW - timedelta(seconds=61)).replace(tzinfo=None)  # SQLite's CURRENT_TIMESTAMP
    assert run_state(2, [], naive_last_contact, NOW, 60).state == "silent"


def register_ranks(client: httpx.Client, key: str, ranks: int) -> None:
    for rank in range(ranks):
        response = client.put(f"/api/v1/runs/{key}/ranks/{rank}", json={"host": "h", "pid": 100 + rank})
        assert response.status_code == 200, response.text


def end(client: httpx.Client, key: str, rank: int, body: Any) -> httpx.Response:
    return client.put(f"/api/v1/runs/{key}/ranks/{rank}/end", json=body)


def test_rank_ends_give_the_run_its_state(server: LiveServer) -> None:
    with server.client() as client:
        key = register(client, world_size=2)
        register_ranks(client, key, 2)
        run = client.get(f"/api/v1/runs/{key}").json()
        assert run["state"] == "running" and [r["outcome"] for r in run["ranks"]] == [None, None]
        first = end(client, key, 0, {"outcome": "finished"})
        assert first.status_code == 200 and first.json()["outcome"] == "finished" and first.json()["ended_at"]
        assert client.get(f"/api/v1/runs/{key}").json()["state"] == "running"
        assert end(client, key, 1, {"outcome": "finished"}).status_code == 200
        listed = {r["key"]: r for r in client.get("/api/v1/runs").json()}
        assert listed[key]["state"] == "finished" and listed[key]["state_detail"] == "all 2 ranks finished"

        failing = register(client, world_size=2)
        register_ranks(client, failing, 2)
        assert end(client, failing, 1, {"outcome": "failed", "error": "ValueError: nan loss"}).status_code == 200
        run = client.get(f"/api/v1/runs/{failing}").json()
        assert (run["state"], run["state_detail"]) == ("failed", "rank 1 failed: ValueError: nan loss")
        assert run["ranks"][1]["error"] == "ValueError: nan loss" and run["ranks"][0]["outcome"] is None
        register_ranks(client, failing, 2)  # restarted workers (torchrun --max-restarts) register again
        run = client.get(f"/api/v1/runs/{failing}").json()
        assert run["state"] == "running" and run["ranks"][1]["outcome"] is None and run["ranks"][1]["error"] is None


def test_a_run_not_heard_from_turns_silent_at_the_asked_threshold(server: LiveServer) -> None:
    with server.client() as client:
        key = register(client, world_size=1)
        register_ranks(client, key, 1)
        assert client.get(f"/api/v1/runs/{key}").json()["state"] == "running"  # the service's 120 s default
        time.sleep(2.2)  # SQLite stamps whole seconds
        run = client.get(f"/api/v1/runs/{key}", params={"silent_after_s": 1}).json()
        assert run["state"] == "silent" and run["state_detail"].startswith("nothing heard for ")
        listed = {r["key"]: r["state"] for r in client.get("/api/v1/runs", params={"silent_after_s": 1}).json()}
        assert listed[key] == "silent"
        assert_names(
            client.get(f"/api/v1/runs/{key}", params={"silent_after_s": 0}),
            422,
            ["query", "silent_after_s"],
            "greater than 0",
        )


@pytest.mark.parametrize(
    "body,loc,words",
    [
        ({"outcome": "crashed"}, ["body", "outcome"], "'finished' or 'failed'"),
        ({}, ["body", "outcome"], "Field required"),
        ({"outcome": "failed", "error": "x" * 1001}, ["body", "error"], "at most 1000"),
        ({"outcome": "finished", "exit_code": 0}, ["body", "exit_code"], "Extra inputs"),
        ({"outcome": "finished", "end_ns": -1}, ["body", "end_ns"], "greater than or equal to 0"),
        ({"outcome": "finished", "end_ns": "5"}, ["body", "end_ns"], "valid integer"),
        ({"outcome": "finished", "end_ns": 2**63}, ["body", "end_ns"], "less than or equal to"),
        ({"outcome": "finished", "error": "x"}, ["body", "error"], "only with outcome 'failed'"),
    ],
)
def test_a_bad_end_names_the_field_and_changes_nothing(
    server: LiveServer, body: Any, loc: list[str], words: str
) -> None:
    with server.client() as client:
        key = register(client, world_size=1)
        register_ranks(client, key, 1)
        assert_names(end(client, key, 0, body), 422, loc, words)
        rank = client.get(f"/api/v1/runs/{key}").json()["ranks"][0]
        assert (rank["outcome"], rank["error"], rank["ended_at"]) == (None, None, None)


def test_the_end_of_an_unknown_run_or_rank_is_a_404(server: LiveServer) -> None:
    with server.client() as client:
        assert_names(end(client, "no-such-run", 0, {"outcome": "finished"}), 404, ["path", "run_key"], "no run")
        key = register(client, world_size=2)
        register_ranks(client, key, 1)
        assert_names(end(client, key, 1, {"outcome": "finished"}), 404, ["path", "rank"], "not registered")


def test_failures_are_ordered_on_rank_0s_clock(server: LiveServer) -> None:
    """Rank 1's clock runs 10 µs ahead: its end at 12 µs on its clock is 2 µs on rank 0's, before
    rank 0's end at 5 µs, so rank 1 failed first (by raw times it would be rank 0)."""
    with server.client() as client:
        key = register(client, world_size=2)
        for rank, offset in ((0, 0), (1, 10_000)):
            body = {"host": "h", "pid": rank, "clock_offset_ns": offset}
            assert client.put(f"/api/v1/runs/{key}/ranks/{rank}", json=body).status_code == 200
        assert (
            end(client, key, 0, {"outcome": "failed", "error": "RuntimeError: peer gone", "end_ns": 5_000}).status_code
            == 200
        )
        assert (
            end(client, key, 1, {"outcome": "failed", "error": "ValueError: nan", "end_ns": 12_000}).status_code == 200
        )
        detail = client.get(f"/api/v1/runs/{key}").json()["state_detail"]
        assert detail == "rank 1 failed first: ValueError: nan (then rank 0)"
        # The offset re-estimated during the run and sent with the end wins over the registered one:
        # rank 1's clock has drifted to 2 µs ahead, so its end at 12 µs is 10 µs, after rank 0's 5 µs.
        body = {"outcome": "failed", "error": "ValueError: nan", "end_ns": 12_000, "clock_offset_ns": 2_000}
        assert end(client, key, 1, body).status_code == 200
        detail = client.get(f"/api/v1/runs/{key}").json()["state_detail"]
        assert detail == "rank 0 failed first: RuntimeError: peer gone (then rank 1)"


def test_serve_silent_after_sets_the_default_threshold(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bubblescope.db'}"
    migrate.upgrade(url)
    live = start_server(url, tmp_path, extra_args=["--silent-after", "1"])
    try:
        with live.client() as client:
            key = register(client, world_size=1)
            time.sleep(2.2)
            assert client.get(f"/api/v1/runs/{key}").json()["state"] == "silent"
            assert client.get(f"/api/v1/runs/{key}", params={"silent_after_s": 60}).json()["state"] == "running"
    finally:
        live.stop()
    refused = subprocess.run(
        [sys.executable, "-m", "bubblescope.cli", "serve", "--db", url, "--silent-after", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "--silent-after: 0 is not above 0" in refused.stderr


def test_a_rank_killed_before_a_broken_connection_is_named_not_the_rank_that_saw_it() -> None:
    from datetime import datetime, timedelta, timezone

    now = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)
    ends = [
        RankEnd(0, "failed", "RuntimeError: Connection reset by peer", end_ns=5, ended_at=now, last_heard_at=now),
        RankEnd(1, None, host="node7", stage=1, last_step=41, last_heard_at=now - timedelta(seconds=3)),
    ]
    state = run_state(2, ends, now, now, 60)
    assert state.state == "failed"
    assert state.detail.startswith("rank 1 (host node7, stage 1, last step 41) went quiet without reporting an end")


def test_an_end_from_a_process_that_was_replaced_is_ignored(sqlite_server: LiveServer) -> None:
    """torchrun restarted the worker: its predecessor's late end must not fail the running rank."""
    with sqlite_server.client() as client:
        key = register(client, world_size=1)
        rank = {"host": "h", "pid": 200, "clock_offset_ns": 0, "clock_uncertainty_ns": 0}
        assert client.put(f"/api/v1/runs/{key}/ranks/0", json=rank).status_code == 200
        stale = {"outcome": "failed", "error": "SIGTERM: terminated", "pid": 100}
        assert client.put(f"/api/v1/runs/{key}/ranks/0/end", json=stale).status_code == 200
        assert client.get(f"/api/v1/runs/{key}").json()["state"] == "running"
        own = {"outcome": "finished", "pid": 200}
        assert client.put(f"/api/v1/runs/{key}/ranks/0/end", json=own).json()["outcome"] == "finished"
        assert client.get(f"/api/v1/runs/{key}").json()["state"] == "finished"
