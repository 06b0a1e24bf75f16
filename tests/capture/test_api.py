"""POST /api/v1/runs/{key}/capture on SQLite and PostgreSQL: validation, the from_step rule, and
the pending requests carried by the ingest answers."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support import LiveServer, assert_names, count_rows, post_gzip, register

BASE_NS = 1_700_000_000_000_000_000


def steps_batch(key: str, rank: int, seq: int, steps: range) -> dict[str, Any]:
    """A batch of step aggregates only (no spans), as the collector sends for unsampled steps."""
    aggregates = [
        {
            "step": s,
            "start_ns": BASE_NS + s * 1_000_000,
            "end_ns": BASE_NS + s * 1_000_000 + 900_000,
            "compute_ns": 900_000,
            "comm_ns": 0,
            "exposed_comm_ns": 0,
            "idle_ns": 0,
            "span_count": 0,
        }
        for s in steps
    ]
    empty: dict[str, list[Any]] = {"step": [], "kind": [], "start_ns": [], "end_ns": []}
    return {"run_key": key, "rank": rank, "seq": seq, "steps": aggregates, "spans": empty}


def ingest(client: httpx.Client, key: str, rank: int, seq: int, steps: range) -> dict[str, Any]:
    response = post_gzip(client, steps_batch(key, rank, seq, steps))
    assert response.status_code == 202, response.text
    return response.json()


def capture(client: httpx.Client, key: str, steps: int) -> dict[str, Any]:
    response = client.post(f"/api/v1/runs/{key}/capture", json={"steps": steps})
    assert response.status_code == 201, response.text
    return response.json()


BAD_BODIES: list[tuple[str, Any, int, list[Any], str]] = [
    ("zero", {"steps": 0}, 422, ["body", "steps"], "greater than or equal to 1"),
    ("too many", {"steps": 10_001}, 422, ["body", "steps"], "less than or equal to 10000"),
    ("string", {"steps": "5"}, 422, ["body", "steps"], "valid integer"),
    ("fraction", {"steps": 5.5}, 422, ["body", "steps"], "valid integer"),
    ("bool", {"steps": True}, 422, ["body", "steps"], "valid integer"),
    ("missing", {}, 422, ["body", "steps"], "Field required"),
    ("extra field", {"steps": 5, "ranks": [0]}, 422, ["body", "ranks"], "Extra inputs"),
    ("not an object", [5], 422, ["body"], "valid dictionary"),
]


@pytest.mark.parametrize("case", BAD_BODIES, ids=[c[0] for c in BAD_BODIES])
def test_bad_capture_requests_name_the_field_and_store_nothing(server: LiveServer, case: tuple) -> None:
    _name, body, status, loc, words = case
    with server.client() as client:
        key = register(client)
        assert_names(client.post(f"/api/v1/runs/{key}/capture", json=body), status, loc, words)
    assert count_rows(server.db_url, "capture_requests", key) == 0


def test_capture_of_an_unknown_run_or_a_malformed_body_is_refused(server: LiveServer) -> None:
    with server.client() as client:
        assert_names(
            client.post("/api/v1/runs/no-such-run/capture", json={"steps": 5}), 404, ["path", "run_key"], "no run"
        )
        assert_names(
            client.post("/api/v1/runs/bad key!/capture", json={"steps": 5}), 422, ["path", "run_key"], "pattern"
        )
        key = register(client)
        malformed = client.post(
            f"/api/v1/runs/{key}/capture", content=b'{"steps": ', headers={"Content-Type": "application/json"}
        )
        assert_names(malformed, 400, ["body"], "malformed JSON")


def test_from_step_leads_the_newest_step_by_three_batches_and_ingest_answers_carry_it(server: LiveServer) -> None:
    with server.client() as client:
        key = register(client, world_size=2)
        first = capture(client, key, 7)
        assert first == {
            "id": first["id"],
            "steps": 7,
            "from_step": 0,
            "kind": "spans",
            "upload_ranks": None,
        }  # nothing ingested yet

        ingest(client, key, rank=0, seq=0, steps=range(10))
        ingest(client, key, rank=1, seq=0, steps=range(5))
        second = capture(client, key, 5)
        assert second["from_step"] == 9 + 1 + 3 * 10 and second["id"] > first["id"]
        pending = [{"id": second["id"], "from_step": 40, "steps": 5, "kind": "spans", "upload_ranks": None}]

        # Rank 0 has shipped through step 19: the first request is over, the second is not.
        assert ingest(client, key, rank=0, seq=1, steps=range(10, 20))["captures"] == pending
        assert ingest(client, key, rank=1, seq=1, steps=range(5, 10))["captures"] == pending
        retried = post_gzip(client, steps_batch(key, 0, 1, range(10, 20))).json()
        assert retried["duplicate"] is True and retried["captures"] == pending
        # Through step 44 (the request's last step): over for rank 0, still pending for rank 1.
        assert ingest(client, key, rank=0, seq=2, steps=range(20, 35))["captures"] == pending
        assert ingest(client, key, rank=0, seq=3, steps=range(35, 45))["captures"] == []
        assert ingest(client, key, rank=1, seq=2, steps=range(10, 25))["captures"] == pending

        # The lead follows the cadence: rank 0's batches now carry up to 15 steps.
        third = capture(client, key, 100)
        assert third["from_step"] == 44 + 1 + 3 * 15
    assert count_rows(server.db_url, "capture_requests", key) == 3


def test_a_profile_request_is_a_capture_of_its_own_kind(server: LiveServer) -> None:
    """``POST /runs/{key}/profile``: the same from_step rule, one waiting request per kind (a waiting capture
    does not stand for a profile), at most 20 steps, and the ingest answers carry it with its kind."""
    with server.client() as client:
        key = register(client, world_size=1)
        ingest(client, key, rank=0, seq=0, steps=range(10))
        spans = capture(client, key, 5)
        asked = client.post(f"/api/v1/runs/{key}/profile", json={"steps": 3})
        assert asked.status_code == 201, asked.text
        profile = asked.json()
        assert profile == {
            "id": profile["id"],
            "steps": 3,
            "from_step": 9 + 1 + 3 * 10,
            "kind": "profile",
            "upload_ranks": [0],  # by default the first 8 ranks upload their traces: here the one
        }
        again = client.post(f"/api/v1/runs/{key}/profile", json={"steps": 4})
        assert again.status_code == 200 and again.json() == profile  # the one waiting, not a second
        answer = ingest(client, key, rank=0, seq=1, steps=range(10, 12))["captures"]
        assert answer == [spans, profile], answer
        assert_names(
            client.post(f"/api/v1/runs/{key}/profile", json={"steps": 21}),
            422,
            ["body", "steps"],
            "less than or equal to 20",
        )
        assert_names(
            client.post("/api/v1/runs/no-such-run/profile", json={"steps": 2}), 404, ["path", "run_key"], "no run"
        )
    assert count_rows(server.db_url, "capture_requests", key) == 2


def test_the_ranks_that_upload_a_profile_are_the_run_s_and_at_most_eight(server: LiveServer) -> None:
    with server.client() as client:
        key = register(client, world_size=16)
        assert client.post(f"/api/v1/runs/{key}/profile", json={"steps": 2}).json()["upload_ranks"] == list(range(8))
        assert_names(
            client.post(f"/api/v1/runs/{key}/profile", json={"steps": 2, "upload_ranks": list(range(9))}),
            422,
            ["body", "upload_ranks"],
            "at most 8",
        )
        for ranks, words in (([16], "ranks [16] are not in this run of 16"), ([], "at least 1"), (["3"], "integer")):
            other = register(client, world_size=16)
            assert_names(
                client.post(f"/api/v1/runs/{other}/profile", json={"steps": 2, "upload_ranks": ranks}),
                422,
                ["body", "upload_ranks"],
                words,
            )
            assert count_rows(server.db_url, "capture_requests", other) == 0
        chosen = register(client, world_size=16)
        asked = client.post(f"/api/v1/runs/{chosen}/profile", json={"steps": 2, "upload_ranks": [15, 3, 15]})
        assert asked.status_code == 201 and asked.json()["upload_ranks"] == [3, 15]
